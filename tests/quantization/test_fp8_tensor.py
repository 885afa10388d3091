"""Per-tensor FP8 checkpoints (quant_method fp8 without weight_block_size: AutoFP8, vLLM's fp8
method), static and dynamic activations (against transformers: test_checkpoints.py): fused
linears, ignored_layers left unquantized, k/v scales read, what vLLM refuses refused by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.quantization.loading import detect_format
from compiled_llm.quantization.w8a8 import DynamicFp8Linear, StaticFp8Linear
from compiled_llm.worker.loader import load_model
from tests.quantization.packers import packed_pair
from tests.quantization.test_edge_cases import _edited_copy

KINDS = ("fp8_tensor_static", "fp8_tensor_dynamic")
CPU = torch.device("cpu")


@pytest.mark.parametrize(("kind", "linear"), [("fp8_tensor_static", StaticFp8Linear),
                                              ("fp8_tensor_dynamic", DynamicFp8Linear)])
def test_linears_fused_ignored_layers_plain_kv_scales_read(kind, linear):
    """q/k/v and gate/up share one fused weight (their calibrated input scales are equal); the
    ignored down_proj stays a float32 nn.Linear; AutoFP8's self_attn.k_scale / v_scale fill
    the scales an FP8 KV cache reads."""
    model = load_model(packed_pair(kind)[0], torch.float32, CPU, 64)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert all(type(m) is linear for m in (attn.q_proj, attn.o_proj, mlp.gate_proj))
    assert (attn.k_proj.offset, mlp.up_proj.offset) == (128, 256)
    assert type(mlp.down_proj) is torch.nn.Linear
    assert mlp.down_proj.weight.dtype == torch.float32
    static = kind == "fp8_tensor_static"
    assert sorted(model.checkpoint_kv_scales) == ([0, 1] if static else [])


def test_unequal_static_input_scales_stay_unfused():
    """k_proj calibrated apart from q_proj / v_proj: each keeps its own input scale (unfused,
    as compressed-tensors' static FP8), so its activations quantize as the checkpoint says."""
    name = "model.layers.0.self_attn.k_proj.input_scale"
    edited = _edited_copy(packed_pair("fp8_tensor_static")[0],
                          lambda tensors: tensors.update({name: tensors[name] * 2}))
    attn = load_model(edited, torch.float32, CPU, 64).model.layers[0].self_attn
    assert attn.k_proj.offset == 0 and "fused_weight" not in vars(attn.k_proj)
    torch.testing.assert_close(attn.k_proj.input_scale * 0.5, attn.q_proj.input_scale)


def test_per_channel_weight_scale_refused_naming_the_linear():
    """vLLM's fp8 method reads one weight scale per tensor; [N] scales are refused by name."""
    name = "model.layers.0.self_attn.o_proj.weight_scale"
    edited = _edited_copy(packed_pair("fp8_tensor_dynamic")[0],
                          lambda tensors: tensors.update({name: torch.ones(128)}))
    with pytest.raises(ValueError, match=r"self_attn.o_proj: fp8 checkpoint: weight_scale has "
                                         r"shape \(128,\); this format stores one value"):
        load_model(edited, torch.float32, CPU, 64)


@pytest.mark.parametrize(("field", "value"), [
    ("fmt", "e5m2"), ("activation_scheme", "per_token"), ("kv_cache_scheme", {"num_bits": 8}),
    ("ignored_layers", "lm_head"), ("weight_scale_fmt", "ue8m0")])
def test_bad_fields_refused_by_name(field, value):
    config = {"quant_method": "fp8", "activation_scheme": "static", field: value}
    with pytest.raises(ValueError, match=rf"fp8 checkpoint: quantization_config.{field}="):
        detect_format({"quantization_config": config}, None)


def test_autofp8_configs_accepted():
    for config in ({"quant_method": "fp8", "activation_scheme": "static",
                    "ignored_layers": ["lm_head"], "kv_cache_scheme": "static"},
                   {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "modules_to_not_convert": ["lm_head"]}):
        fmt = detect_format({"quantization_config": config}, None)
        assert fmt.name == "fp8" and fmt.marker == "weight_scale"
        assert fmt.static == (config["activation_scheme"] == "static")


def test_moe_models_refused_naming_the_field():
    """Per-tensor FP8 experts are not read yet (block FP8 ones are: test_moe_fp8.py)."""
    from compiled_llm.models import DecoderConfig
    from compiled_llm.quantization.formats import PerTensorFp8Format
    from compiled_llm.quantization.loading import prepare_quantized

    model = torch.nn.Module()
    model.config = DecoderConfig.from_hf({"vocab_size": 8, "hidden_size": 8,
                                          "intermediate_size": 8, "num_hidden_layers": 1,
                                          "num_attention_heads": 1, "num_experts": 2,
                                          "num_experts_per_tok": 1})
    with pytest.raises(ValueError, match=r"fp8 checkpoints of mixture-of-experts models are "
                                         r"not supported yet \(quantization_config.weight_bl"):
        prepare_quantized(model, PerTensorFp8Format(), [])
