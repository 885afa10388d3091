"""The Triton fused MoE against the torch reference, run by test_interpreter.py in a subprocess
with TRITON_INTERPRET=1 (CPU tensors, small shapes). Not collected directly: see that file.

float32 and float16, block-FP8 experts, ids of experts held elsewhere; bf16 is checked on the
GPU (the interpreter's tl.dot mishandles it).
"""

from __future__ import annotations

import pytest
import torch

from compiled_llm.moe import fused_moe_reference, triton_moe
from compiled_llm.moe.kernels import MoeGemmConfig, kernels_interpreted
from compiled_llm.moe.triton_moe import fused_moe_triton, moe_gemm_config
from tests.moe.helpers import moe_inputs

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

SMALL = MoeGemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}


def _check(args, config=SMALL):
    out = fused_moe_triton(*args, config=config)
    ref = fused_moe_reference(*args)
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    scale = max(1.0, ref.float().abs().max().item())
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOLERANCE[args[0].dtype] * scale, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 8, 2, 32, 32), (13, 6, 2, 32, 48), (40, 4, 3, 48, 40)])
def test_matches_reference(dtype, shape):
    _check(moe_inputs(*shape, dtype=dtype, seed=sum(shape)))


def test_idle_experts_and_one_crowded_expert():
    x, w13, w2, weights, ids = moe_inputs(37, 8, 2, 32, 32)
    ids[:, 0] = 5  # every token picks expert 5 first: many blocks of one expert
    ids[:, 1] = torch.where(ids[:, 1] == 5, 2, ids[:, 1]) % 3  # experts 3, 4, 6, 7 idle
    ids[:, 1] = torch.where(ids[:, 1] == 5, 0, ids[:, 1])
    _check((x, w13, w2, weights, ids))


def test_table_config_for_decode():
    args = moe_inputs(1, 8, 2, 64, 32)
    config = moe_gemm_config(1, 2, 8, torch.float32)
    assert config.block_m == 16 and config.block_k == 64  # fp32 halves the table's block_k
    _check(args, config)


def test_long_batches_run_in_chunks(monkeypatch):
    monkeypatch.setattr(triton_moe, "CHUNK_TOKENS", 8)
    _check(moe_inputs(21, 4, 2, 32, 16, seed=5))



def test_ids_past_the_weights_add_nothing():
    # expert parallelism: id E (one past this rank's experts) is another rank's expert
    x, w13, w2, weights, ids = moe_inputs(11, 4, 2, 32, 16, seed=7)
    ids[::3, 1] = 4
    _check((x, w13, w2, weights, ids))


@pytest.mark.parametrize("num_tokens", [1, 13])
def test_block_fp8_matches_reference(num_tokens):
    from compiled_llm.moe.reference import fused_moe_reference as reference
    from compiled_llm.moe.triton_moe import BlockScales
    from compiled_llm.quantization.fp8_groups import quant_fp8_groups
    from compiled_llm.quantization.moe_fp8 import block_quantize

    x, w13, w2, weights, ids = moe_inputs(num_tokens, 4, 2, 128, 128, seed=num_tokens)
    (q13, s13), (q2, s2) = block_quantize(w13), block_quantize(w2)
    scales = BlockScales(s13, s2, quant_fp8_groups)
    out = fused_moe_triton(x, q13, q2, weights, ids, config=SMALL, scales=scales)
    ref = reference(x, q13, q2, weights, ids, s13, s2, quant_fp8_groups)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
