"""The Triton fused MoE on the GPU (CUDA only): bf16 and block FP8 at Qwen3-30B-A3B's layer
shape against the reference, the op captured in a CUDA graph and replayed on new routing, and
MoE models' greedy tokens (bf16, and a block-FP8 checkpoint) with CUDA graphs equal to eager."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.moe import fused_moe, fused_moe_reference
from tests.moe.helpers import moe_inputs
from tests.utils import make_checkpoint, random_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LAYER = (128, 8, 2048, 768)  # Qwen3-30B-A3B: experts, top-k, hidden, expert intermediate


def _cuda(args):
    return [a.cuda() for a in args]


def _rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("num_tokens", [1, 16, 256, 2048])
def test_bf16_matches_reference(num_tokens):
    args = _cuda(moe_inputs(num_tokens, *LAYER, dtype=torch.bfloat16, seed=num_tokens))
    out = fused_moe(*args)  # the op dispatches to the Triton kernel on CUDA
    assert _rel_err(out, fused_moe_reference(*args)) < 1e-2


@pytest.mark.parametrize("num_tokens", [1, 64, 1024])
def test_block_fp8_matches_reference(num_tokens):
    from compiled_llm.quantization.moe_fp8 import block_quantize, fused_moe_fp8

    x, w13, w2, weights, ids = _cuda(moe_inputs(num_tokens, *LAYER, dtype=torch.bfloat16,
                                                seed=num_tokens))
    (q13, s13), (q2, s2) = block_quantize(w13), block_quantize(w2)
    out = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids)  # Triton on CUDA
    cpu = [t.cpu() for t in (x, q13, s13, q2, s2, weights, ids)]
    ref = fused_moe_fp8(*cpu)  # the torch reference (same activation quantization) on CPU
    assert _rel_err(out.cpu(), ref) < 2e-2


def test_float32_matches_reference():
    args = _cuda(moe_inputs(37, 8, 2, 256, 128))
    torch.testing.assert_close(fused_moe(*args), fused_moe_reference(*args), atol=1e-4,
                               rtol=1e-4)


def test_captured_in_a_cuda_graph_and_replayed_on_new_routing():
    x, w13, w2, weights, ids = _cuda(moe_inputs(8, *LAYER, dtype=torch.bfloat16))
    fused_moe(x, w13, w2, weights, ids)  # compile the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    for seed in (1, 2):
        new = _cuda(moe_inputs(8, *LAYER, dtype=torch.bfloat16, seed=seed))
        for static, fresh in zip((x, weights, ids), (new[0], new[3], new[4])):
            static.copy_(fresh)
        graph.replay()
        assert _rel_err(out, fused_moe_reference(x, w13, w2, weights, ids)) < 1e-2


def _cudagraphs_match_eager(ckpt, tmp_path) -> None:
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, 300, lo=2, hi=60, seed=4)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    common = dict(engine_core_process=False, dtype="float32", gpu_memory_utilization=0.3)
    eager = LLM(str(ckpt), enforce_eager=True, attention_backend="torch", **common)
    ref = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(ckpt), cudagraph_mode="full_and_piecewise", max_num_seqs=8,
              compile_cache_dir=str(tmp_path), **common)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == ref
    assert llm.engine.num_used_blocks == 0


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe"])
def test_moe_model_with_cudagraphs_matches_eager(name, tmp_path):
    _cudagraphs_match_eager(make_checkpoint(name), tmp_path)


def test_fp8_moe_checkpoint_with_cudagraphs_matches_eager(tmp_path):
    from tests.quantization.packers import fp8_moe_pair

    _cudagraphs_match_eager(fp8_moe_pair()[0], tmp_path)
