"""Format detection from quantization_config: what is not implemented is refused with a
ValueError naming the format and the field; an explicit quantization must agree."""

from __future__ import annotations

import pytest

from compiled_llm import LLM
from compiled_llm.quantization.loading import QUANT_FORMATS, detect_format
from tests.quantization.packers import BLOCK_FP8_CONFIG, CONFIGS
from tests.utils import make_checkpoint


def _ct(weights: dict, acts: dict | None = None, fmt: str = "pack-quantized", **extra) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts,
             "format": fmt}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}, **extra}


W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True,
      "dynamic": False, "actorder": None}
FP8_W = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
         "dynamic": False}
TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}

REFUSED = [
    ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
    ({**CONFIGS["gptq"], "bits": 8}, r"gptq checkpoint: quantization_config.bits=8"),
    ({**CONFIGS["gptq"], "sym": False}, r"gptq .*sym=False"),
    ({**CONFIGS["gptq"], "group_size": -1}, r"gptq .*group_size=-1"),
    ({**CONFIGS["gptq"], "checkpoint_format": "gptq_v2"}, r"gptq .*checkpoint_format"),
    ({**CONFIGS["awq"], "zero_point": False}, r"awq .*zero_point=False"),
    ({**CONFIGS["awq"], "version": "gemv"}, r"awq .*version='gemv'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, r"fp8 .*weight_block_size=None"),
    ({**BLOCK_FP8_CONFIG, "weight_block_size": [64, 64]}, r"fp8 .*weight_block_size=\(64, 64\)"),
    ({**BLOCK_FP8_CONFIG, "activation_scheme": "static"}, r"fp8 .*activation_scheme='static'"),
    (_ct({**W4, "symmetric": False}), r"compressed-tensors .*weights.symmetric=False"),
    (_ct({**W4, "actorder": "group"}), r"compressed-tensors .*weights.actorder='group'"),
    (_ct({**W4, "group_size": 100}), r"compressed-tensors .*weights.group_size=100"),
    (_ct({**W4, "num_bits": 4}, fmt="marlin-24"), r"compressed-tensors .*format='marlin-24'"),
    (_ct(FP8_W, {**TOKEN, "strategy": "group"}, "float-quantized"),
     r"compressed-tensors .*input_activations="),
    (_ct(FP8_W, TOKEN, "float-quantized", kv_cache_scheme={"num_bits": 8}),
     r"compressed-tensors .*kv_cache_scheme"),
    ({**_ct(W4), "config_groups": {"a": {}, "b": {}}}, r"compressed-tensors .*config_groups"),
]


@pytest.mark.parametrize(("config", "message"), REFUSED)
def test_unsupported_configs_name_format_and_field(config, message):
    with pytest.raises(ValueError, match=message):
        detect_format({"quantization_config": config}, None)


def test_supported_configs_and_explicit_quantization():
    assert set(QUANT_FORMATS) == {"fp8", "gptq", "awq", "compressed-tensors"}
    for config in (*CONFIGS.values(), _ct(W4), _ct(FP8_W, TOKEN, "float-quantized")):
        assert detect_format({"quantization_config": config}, None) is not None
    assert detect_format({"quantization_config": CONFIGS["gptq"]}, "gptq").name == "gptq"
    assert detect_format({}, None) is None and detect_format({}, "fp8") is None
    with pytest.raises(ValueError, match="quantization='awq' conflicts with .*'gptq'"):
        detect_format({"quantization_config": CONFIGS["gptq"]}, "awq")
    with pytest.raises(ValueError, match="quantization='fp8' conflicts"):
        detect_format({"quantization_config": _ct(W4)}, "fp8")


def test_llm_refuses_quantization_the_checkpoint_lacks():
    with pytest.raises(ValueError, match="quantization='gptq' needs a checkpoint"):
        LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
            quantization="gptq")
