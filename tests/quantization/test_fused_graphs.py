"""Quantized linears through the compiler: q/k/v and gate/up share one fused packed weight
(and scales, zeros), the graph traces fullgraph, and HorizontalGemmFusionPass turns each
layer's seven quantized gemms into four; outputs equal eager. FP8 activation quant still fuses
into its producers."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import capture_model
from tests.quantization.packers import LLAMA, packed_pair

LAYERS = LLAMA["num_hidden_layers"]
OPS = {"gptq_act_order": "compiled_llm.w4a16_gemm", "fp8_block": "compiled_llm.fp8_block_gemm",
       "ct_W8A8": "compiled_llm.int8_gemm", "ct_FP8_DYNAMIC": "compiled_llm.fp8_gemm",
       "ct_W8A8_STATIC": "compiled_llm.int8_gemm", "ct_W8A8_STATIC_ASYM": "compiled_llm.int8_gemm"}


@pytest.mark.parametrize("kind", sorted(OPS))
def test_seven_quantized_gemms_to_four_per_layer(kind):
    model = load_model(packed_pair(kind)[0], torch.float32, torch.device("cpu"), 512)
    attn = model.model.layers[0].self_attn
    base = attn.qkv_proj_qweight if kind == "gptq_act_order" else attn.qkv_proj_weight
    assert base.shape[0] == LLAMA["hidden_size"] * 2  # q rows, then k and v (2 kv heads each)
    ref, out, before, after, manager = capture_model(model, 10,
                                                     PassConfig(inline_fused_ops=False))
    assert before[OPS[kind]] == 7 * LAYERS and after[OPS[kind]] == 4 * LAYERS
    assert manager.matches("HorizontalGemmFusionPass") == 2 * LAYERS
    if kind == "ct_FP8_DYNAMIC":  # the norm + quant and SiLU·mul + quant passes still fire
        assert before["compiled_llm.quant_fp8_per_token"] == 7 * LAYERS
        assert after["compiled_llm.quant_fp8_per_token"] == LAYERS  # o_proj's: attention feeds it
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
