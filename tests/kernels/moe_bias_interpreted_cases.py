"""The Triton fused MoE with per-expert biases, GPT-OSS's swigluoai and Gemma 4's gelu_tanh
activations against the torch reference, run by test_interpreter.py in a subprocess with
TRITON_INTERPRET=1 (CPU tensors, small shapes). Not collected directly: see that file.
"""

from __future__ import annotations

import pytest
import torch

from compiled_llm.moe import GatedActivation, fused_moe_reference
from compiled_llm.moe.kernels import MoeGemmConfig, kernels_interpreted
from compiled_llm.moe.triton_moe import BlockScales, fused_moe_triton
from tests.moe.helpers import moe_inputs

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

SMALL = MoeGemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}
CASES = {  # name -> (biased, activation); limit 0.5 so that both clamps bite
    "silu_bias": (True, GatedActivation()),
    "swigluoai": (False, GatedActivation("swigluoai", 1.702, 0.5)),
    "swigluoai_bias": (True, GatedActivation("swigluoai", 1.702, 0.5)),
    "swigluoai_hf_limit": (True, GatedActivation("swigluoai")),
    "gelu_tanh": (False, GatedActivation("gelu_tanh")),  # Gemma 4's experts
}


def _biases(w13, w2, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(w13.shape[:2], generator=gen).to(w13.dtype),
            torch.randn(w2.shape[:2], generator=gen).to(w2.dtype))


def _check(args, biased, activation, config=SMALL):
    w13_bias, w2_bias = _biases(args[1], args[2], 3) if biased else (None, None)
    extras = {"w13_bias": w13_bias, "w2_bias": w2_bias, "activation": activation}
    out = fused_moe_triton(*args, config=config, **extras)
    ref = fused_moe_reference(*args, **extras)
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    scale = max(1.0, ref.float().abs().max().item())
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOLERANCE[args[0].dtype] * scale, err


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 8, 2, 32, 32), (13, 6, 2, 32, 48), (40, 4, 3, 48, 40)])
def test_matches_reference(case, dtype, shape):
    _check(moe_inputs(*shape, dtype=dtype, seed=sum(shape)), *CASES[case])


def test_ids_past_the_weights_add_nothing_not_even_a_bias():
    # expert parallelism: id E is another rank's expert, whose bias that rank adds
    x, w13, w2, weights, ids = moe_inputs(11, 4, 2, 32, 16, seed=7)
    ids[::3, 1] = 4
    _check((x, w13, w2, weights, ids), *CASES["swigluoai_bias"])


def test_float32_biases_with_float16_weights():
    # checkpoints may keep biases in float32: the epilogue reads them as float32 either way
    args = moe_inputs(9, 4, 2, 32, 16, dtype=torch.float16, seed=2)
    w13_bias, w2_bias = _biases(args[1].float(), args[2].float(), 4)
    activation = GatedActivation("swigluoai")
    out = fused_moe_triton(*args, config=SMALL, w13_bias=w13_bias, w2_bias=w2_bias,
                           activation=activation)
    ref = fused_moe_reference(*args, w13_bias=w13_bias, w2_bias=w2_bias, activation=activation)
    torch.testing.assert_close(out, ref, atol=5e-3, rtol=5e-3)


def test_block_fp8_refuses_biases_and_swigluoai():
    from compiled_llm.quantization.fp8_groups import quant_fp8_groups
    from compiled_llm.quantization.moe_fp8 import block_quantize

    x, w13, w2, weights, ids = moe_inputs(3, 4, 2, 128, 128, seed=1)
    (q13, s13), (q2, s2) = block_quantize(w13), block_quantize(w2)
    scales = BlockScales(s13, s2, quant_fp8_groups)
    with pytest.raises(ValueError, match="silu experts without biases"):
        fused_moe_triton(x, q13, q2, weights, ids, config=SMALL, scales=scales,
                         activation=GatedActivation("swigluoai"))
    with pytest.raises(ValueError, match="silu experts without biases"):
        fused_moe_triton(x, q13, q2, weights, ids, config=SMALL, scales=scales,
                         w2_bias=torch.zeros(4, 128))
