"""L2WeightPrefetchPass on model Dynamo graphs (one prefetch of the o projection's weight before
each attention, in the attention's piece, the compute pieces unchanged), on toy graphs (what it
leaves alone), through the engine on the CPU (where the op does nothing) and its warm start;
the prefetch kernel compiled for sm_90 down to machine code."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.attention import attention
from compiled_llm.compile import counters
from compiled_llm.compile.split import piece_hash
from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import model_inputs, prefill_context
from tests.passes.test_qk_norm_rope import pre_split_run, toy_context
from tests.utils import make_checkpoint

PASS = "L2WeightPrefetchPass"
PREFETCH = "compiled_llm.l2_prefetch"
ON_CPU = {"enable_l2_weight_prefetch": True, "l2_weight_prefetch_on_cpu": True}


def _prefetched_weights(pieces) -> list[str]:
    """Names of the weights each split piece prefetches, in order."""
    names = []
    for piece in pieces:
        placeholders = {n.name for n in piece.module.graph.nodes if n.op == "placeholder"}
        for node in piece.module.graph.nodes:
            if getattr(node.target, "__name__", "") == "l2_prefetch.default":
                assert piece.is_split_op  # the prefetch goes with attention
                assert node.args[0].name in placeholders
                names.append(node.args[0].name)
    return names


@pytest.mark.parametrize("name,qk_fused", [("llama", False), ("qwen3", True)])
def test_model_graph_prefetches_o_proj_once_per_layer(name, qk_fused):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    layers = model.config.num_hidden_layers
    ids, pos = model_inputs(model, 10)
    contexts = lambda: prefill_context(model.config, 10, torch.float32)  # noqa: E731
    config = PassConfig(**ON_CPU, enable_qk_norm_rope_kv_write=qk_fused,
                        qk_norm_rope_kv_write_on_cpu=qk_fused)
    out, ref, before, after, pieces, manager, _ = pre_split_run(model, (ids, pos), contexts,
                                                                config)
    assert manager.matches(PASS) == layers
    assert before[PREFETCH] == 0 and after[PREFETCH] == layers
    weights = _prefetched_weights(pieces)
    assert len(weights) == layers and all("o_proj" in w for w in weights)
    assert len(pieces) == 2 * layers + 1 and sum(p.is_split_op for p in pieces) == layers
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # the compute pieces are the ones without the pass: the repeated layer still compiles once
    plain = pre_split_run(model, (ids, pos), contexts, PassConfig(
        enable_l2_weight_prefetch=False, enable_qk_norm_rope_kv_write=qk_fused,
        qk_norm_rope_kv_write_on_cpu=qk_fused))[4]
    hashes = [piece_hash(p.module) for p in pieces if not p.is_split_op]
    assert hashes == [piece_hash(p.module) for p in plain if not p.is_split_op]


def test_weights_below_the_floor_and_off_cuda_get_none():
    """Without the test flag the pass takes CUDA weights of 1 MiB or more only."""
    model = load_model(make_checkpoint("llama"), torch.float32, torch.device("cpu"), 512)
    ids, pos = model_inputs(model, 10)
    contexts = lambda: prefill_context(model.config, 10, torch.float32)  # noqa: E731
    config = PassConfig(enable_qk_norm_rope_kv_write=False, enable_l2_weight_prefetch=True)
    _, _, _, after, _, manager, _ = pre_split_run(model, (ids, pos), contexts, config)
    assert manager.matches(PASS) == 0 and after[PREFETCH] == 0


def test_attention_output_read_by_two_ops_gets_none():
    """The o projection must be the attention output's one reader (through views)."""
    weight = torch.randn(64, 64)

    def fn(q, k, v):
        out = attention(q, k, v, 0, 0.25, -1).flatten(1)
        return torch.nn.functional.linear(out, weight), out.sum()

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(9, heads, 16, generator=gen) for heads in (4, 2, 2))
    _, _, _, after, _, manager, _ = pre_split_run(fn, (q, k, v), toy_context(9, torch.float32),
                                                  PassConfig(**ON_CPU))
    assert manager.matches(PASS) == 0 and after[PREFETCH] == 0


def test_engine_tokens_equal_the_pass_off_and_warm_start(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPILED_LLM_CACHE_DIR", str(tmp_path))
    ckpt = str(make_checkpoint("llama"))
    prompts = [{"prompt_token_ids": [3 + i, 17, 5 * i + 1, 40, 2] * (i + 1)} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    runs = []
    for passes, matches in (({"enable_l2_weight_prefetch": False}, 0), (ON_CPU, 2),
                            (ON_CPU, 0)):  # the last: a warm start from the stored graph
        counters.reset()
        llm = LLM(ckpt, dtype="float32", engine_core_process=False, passes=passes)
        runs.append([o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)])
        assert counters.pass_matches.get(PASS, 0) == matches
        assert llm.engine.num_used_blocks == 0
        del llm
    for outs in runs[1:]:
        assert [o.token_ids for o in outs] == [o.token_ids for o in runs[0]]
        assert [o.cumulative_logprob for o in outs] == [o.cumulative_logprob for o in runs[0]]


def test_prefetch_kernel_compiles_for_sm90():
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from compiled_llm.gemm.prefetch_kernel import LANES, _l2_prefetch_kernel

        signature = {"base_ptr": "*u8", "n_chunks": "i32", "CHUNK": "constexpr",
                     "LANES": "constexpr"}
        source = ASTSource(_l2_prefetch_kernel, signature, {"CHUNK": 4096, "LANES": LANES}, {})
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": 4})
    except (ImportError, KeyError) as err:  # a Triton build without the NVIDIA backend
        pytest.skip(f"no sm_90 backend: {err}")
    assert "cp.async.bulk.prefetch.L2.global" in kernel.asm["ptx"]
    assert kernel.asm["cubin"]
