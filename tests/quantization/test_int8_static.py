"""compressed-tensors W8A8 INT8 with static per-tensor activation scales (symmetric, or with an
input zero point: vLLM's azp correction; against transformers: test_checkpoints.py): siblings
fuse only with equal scales and zero points; what is left unsupported is refused."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.quantization.loading import detect_format
from compiled_llm.quantization.w8a8 import StaticInt8Linear
from compiled_llm.worker.loader import load_model
from tests.quantization.packers import packed_pair
from tests.quantization.test_edge_cases import _edited_copy
from tests.quantization.test_formats import _ct

KINDS = ("ct_W8A8_STATIC", "ct_W8A8_STATIC_ASYM")
CPU = torch.device("cpu")
INT8_W = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
          "dynamic": False}
STATIC = {"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False,
          "symmetric": True}


@pytest.mark.parametrize("kind", KINDS)
def test_siblings_fused_with_their_scales(kind):
    model = load_model(packed_pair(kind)[0], torch.float32, CPU, 64)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert all(type(m) is StaticInt8Linear for m in (attn.q_proj, attn.o_proj, mlp.down_proj))
    assert (attn.k_proj.offset, mlp.up_proj.offset) == (128, 256)
    zero_point = attn.qkv_proj_input_zero_point
    assert (zero_point is not None) == kind.endswith("ASYM")
    # the zero point's correction is folded into a float32 bias (Llama has none of its own)
    assert (attn.qkv_proj_bias is not None) == kind.endswith("ASYM")


@pytest.mark.parametrize(("kind", "field", "factor"), [
    ("ct_W8A8_STATIC", "input_scale", 2), ("ct_W8A8_STATIC_ASYM", "input_zero_point", 3)])
def test_unequal_static_input_quantization_stays_unfused(kind, field, factor):
    """k_proj calibrated apart from q_proj / v_proj: each keeps its own scale or zero point
    (unfused, as static FP8), so its activations quantize as the checkpoint says."""
    name = f"model.layers.0.self_attn.k_proj.{field}"
    edited = _edited_copy(packed_pair(kind)[0],
                          lambda tensors: tensors.update({name: tensors[name] * factor}))
    attn = load_model(edited, torch.float32, CPU, 64).model.layers[0].self_attn
    assert attn.k_proj.offset == 0 and "fused_weight" not in vars(attn.k_proj)
    torch.testing.assert_close(getattr(attn.k_proj, field),
                               getattr(attn.q_proj, field) * factor)


def test_zero_point_correction_is_exact():
    """A large zero point: the output is the dequantized activations (q - zp) * scale times
    the dequantized weight, plus the bias."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (48, 64), generator=gen, dtype=torch.int8)
    weight_scale, bias = torch.rand(48, 1, generator=gen) * 0.01, torch.randn(48, generator=gen)
    x = torch.randn(5, 64, generator=gen) * 2 + 3
    scale, zero = torch.tensor([0.05]), torch.tensor([-90], dtype=torch.int8)
    linear = StaticInt8Linear(weight, weight_scale, scale, zero, bias)
    q = (torch.round(x / scale) + zero).clamp(-128, 127)
    expected = ((q - zero) * scale) @ (weight.float() * weight_scale).t() + bias
    torch.testing.assert_close(linear(x), expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("acts", [
    {**STATIC, "strategy": "token"},  # static per token: no calibrated per-token scales
    {**STATIC, "strategy": "token", "dynamic": True, "symmetric": False},  # dynamic azp
    {**STATIC, "strategy": "group", "group_size": 128},
    {**STATIC, "num_bits": 4}])
def test_unsupported_int8_activations_refused_by_name(acts):
    with pytest.raises(ValueError, match=r"compressed-tensors checkpoint: quantization_config"
                                         r"\.input_activations=.*static per tensor"):
        detect_format({"quantization_config": _ct(INT8_W, acts, "int-quantized")}, None)


def test_static_configs_accepted():
    for symmetric in (True, False):
        config = _ct(INT8_W, {**STATIC, "symmetric": symmetric}, "int-quantized")
        fmt = detect_format({"quantization_config": config}, None)
        assert fmt.scheme == ("int8_static" if symmetric else "int8_static_asym")
