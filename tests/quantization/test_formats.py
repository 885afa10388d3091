"""Format detection from quantization_config: what is not implemented is refused with a
ValueError naming the format and the field; an explicit quantization must agree."""

from __future__ import annotations

import pytest

from compiled_llm import LLM
from compiled_llm.quantization.loading import QUANT_FORMATS, detect_format
from tests.quantization.packers import BLOCK_FP8_CONFIG, CONFIGS
from tests.utils import make_checkpoint


def _ct(weights: dict, acts: dict | None = None, fmt: str = "pack-quantized",
        output_activations_x: object = "absent", output_activations: dict | None = None,
        **extra) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts,
             "output_activations": output_activations, "format": fmt}
    if output_activations_x != "absent":
        group["output_activations_x"] = output_activations_x
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}, **extra}


W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True,
      "dynamic": False, "actorder": None}
FP8_W = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
         "dynamic": False}
TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
# what the publishing libraries write besides the fields that matter (all accepted)
GPTQMODEL = {**CONFIGS["gptq"], "damp_percent": 0.01, "true_sequential": True,
             "static_groups": False, "pack_dtype": "int32", "lm_head": False, "dynamic": None,
             "meta": {"quantizer": ["gptqmodel:2.0"], "damp_auto_increment": 0.0025}}
ACCEPTED = [
    GPTQMODEL, {**CONFIGS["gptq"], "sym": False}, {**CONFIGS["gptq"], "group_size": -1},
    {**CONFIGS["gptq"], "checkpoint_format": "gptq_v2"},
    {"quant_method": "awq", "zero_point": True, "q_group_size": 128, "w_bit": 4,
     "version": "GEMM", "modules_to_not_convert": ["visual"]},
    {**BLOCK_FP8_CONFIG, "modules_to_not_convert": ["lm_head"], "ignored_layers": []},
    {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"],
     "kv_cache_scheme": "static"},  # AutoFP8 (per tensor)
    _ct({**W4, "symmetric": False, "actorder": "group", "observer": "minmax",
         "zp_dtype": "torch.int8"}),
    _ct({**W4, "strategy": "channel", "group_size": None, "actorder": "weight"}),
    _ct({**FP8_W, "strategy": "block", "block_structure": [128, 128]},
        {**TOKEN, "strategy": "group", "group_size": 128}, "float-quantized"),
    _ct(FP8_W, TOKEN, "float-quantized", kv_cache_scheme=KV, global_compression_ratio=None,
        quantization_status="compressed", version="0.12.2", sparsity_config={},
        transform_config={}, moe_sparsity_config=None, ignore=["lm_head"]),
]

REFUSED = [
    ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
    ({**CONFIGS["gptq"], "bits": 8}, r"gptq checkpoint: quantization_config.bits=8"),
    ({**CONFIGS["gptq"], "group_size": 256}, r"gptq .*group_size=256"),
    ({**CONFIGS["gptq"], "checkpoint_format": "marlin"}, r"gptq .*checkpoint_format"),
    ({**CONFIGS["gptq"], "dynamic": {"-:.*down": {}}}, r"gptq .*dynamic="),
    ({**CONFIGS["gptq"], "pack_dtype": "int16"}, r"gptq .*pack_dtype='int16'"),
    # fields no publisher writes: refused by name, never ignored
    ({**CONFIGS["gptq"], "mystery": 1}, r"gptq checkpoint: quantization_config.mystery=1 is not"),
    ({**CONFIGS["awq"], "zero_points": 1}, r"awq .*quantization_config.zero_points=1"),
    (_ct({**W4, "observer_x": 1}), r"compressed-tensors .*weights.observer_x=1"),
    ({**_ct(W4), "extra": 1}, r"compressed-tensors .*quantization_config.extra=1"),
    (_ct(W4, output_activations_x=1), r"compressed-tensors .*group_0.output_activations_x"),
    ({**CONFIGS["awq"], "zero_point": False}, r"awq .*zero_point=False"),
    ({**CONFIGS["awq"], "version": "gemv"}, r"awq .*version='gemv'"),
    # without weight_block_size: per tensor (test_fp8_tensor.py), as strict about its fields
    ({"quant_method": "fp8", "activation_scheme": "static", "fmt": "e5m2"}, r"fp8 .*fmt='e5m2'"),
    ({**BLOCK_FP8_CONFIG, "weight_block_size": [64, 64]}, r"fp8 .*weight_block_size=\(64, 64\)"),
    ({**BLOCK_FP8_CONFIG, "activation_scheme": "static"}, r"fp8 .*activation_scheme='static'"),
    ({**BLOCK_FP8_CONFIG, "scale_fmt": "e4m3"}, r"fp8 .*scale_fmt='e4m3'"),
    (_ct({**W4, "type": "float"}), r"compressed-tensors .*weights.type='float'"),
    (_ct({**W4, "strategy": "channel", "actorder": "group", "group_size": None}),
     r"compressed-tensors .*weights.actorder='group'"),
    (_ct({**W4, "strategy": "tensor"}), r"compressed-tensors .*weights.strategy='tensor'"),
    (_ct(FP8_W, TOKEN, "float-quantized", output_activations=TOKEN),
     r"compressed-tensors .*output_activations="),
    (_ct({**FP8_W, "strategy": "block", "block_structure": [64, 64]}, TOKEN, "float-quantized"),
     r"compressed-tensors .*weights.block_structure=\(64, 64\)"),
    (_ct({**FP8_W, "strategy": "block", "block_structure": [128, 128]}, TOKEN,
         "float-quantized"), r"compressed-tensors .*input_activations=.*per group of 128"),
    (_ct({**W4, "group_size": 100}), r"compressed-tensors .*weights.group_size=100"),
    (_ct({**W4, "num_bits": 4}, fmt="marlin-24"), r"compressed-tensors .*format='marlin-24'"),
    (_ct(FP8_W, {**TOKEN, "strategy": "group"}, "float-quantized"),
     r"compressed-tensors .*input_activations="),
    (_ct(FP8_W, TOKEN, "float-quantized", kv_cache_scheme={"num_bits": 8}),
     r"compressed-tensors .*kv_cache_scheme"),
    (_ct(FP8_W, TOKEN, "float-quantized", kv_cache_scheme={**KV, "dynamic": True}),
     r"compressed-tensors .*kv_cache_scheme"),
    ({**_ct(W4), "config_groups": {"a": {}, "b": {}}}, r"compressed-tensors .*config_groups"),
]


@pytest.mark.parametrize(("config", "message"), REFUSED)
def test_unsupported_configs_name_format_and_field(config, message):
    with pytest.raises(ValueError, match=message):
        detect_format({"quantization_config": config}, None)


def test_supported_configs_and_explicit_quantization():
    assert set(QUANT_FORMATS) == {"fp8", "gptq", "awq", "compressed-tensors", "mxfp4"}
    for config in (*CONFIGS.values(), _ct(W4), _ct(FP8_W, TOKEN, "float-quantized")):
        assert detect_format({"quantization_config": config}, None) is not None
    assert detect_format({"quantization_config": CONFIGS["gptq"]}, "gptq").name == "gptq"
    # vLLM's Marlin kernel names pick the format they run
    assert detect_format({"quantization_config": CONFIGS["gptq"]}, "gptq_marlin").name == "gptq"
    assert detect_format({"quantization_config": CONFIGS["awq"]}, "awq_marlin").name == "awq"
    with pytest.raises(ValueError, match="quantization='awq' conflicts"):
        detect_format({"quantization_config": CONFIGS["gptq"]}, "awq_marlin")
    assert detect_format({}, None) is None and detect_format({}, "fp8") is None
    with pytest.raises(ValueError, match="quantization='awq' conflicts with .*'gptq'"):
        detect_format({"quantization_config": CONFIGS["gptq"]}, "awq")
    with pytest.raises(ValueError, match="quantization='fp8' conflicts"):
        detect_format({"quantization_config": _ct(W4)}, "fp8")


@pytest.mark.parametrize("config", ACCEPTED)
def test_published_configs_accepted(config):
    assert detect_format({"quantization_config": config}, None) is not None


def test_unknown_fields_left_unset_are_accepted():
    """A field a newer library writes at its default (None, False, empty) asks for nothing."""
    for unset in (None, False, [], {}):
        config = {**CONFIGS["gptq"], "newer_option": unset}
        assert detect_format({"quantization_config": config}, None).name == "gptq"


def test_llm_refuses_quantization_the_checkpoint_lacks():
    with pytest.raises(ValueError, match="quantization='gptq' needs a checkpoint"):
        LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
            quantization="gptq")
