"""ERNIE 4.5 MoE's moe_* keys refused by name where transformers' text model cannot take them.
(Both ERNIE 4.5 models are compared with transformers in test_llama_variant_archs.py and
test_shared_expert_archs.py: dense and sparse layers, correction bias, use_bias, tied heads.)"""

from __future__ import annotations

import pytest

from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import make_checkpoint


@pytest.mark.parametrize(("change", "match"), [
    # ERNIE 4.5 VL's per-modality (text, vision) lists
    ({"moe_num_experts": [8, 8]}, r"moe_num_experts \[8, 8\] is not supported"),
    ({"num_experts": [8, 8]}, r"num_experts \[8, 8\] is not supported"),  # the alias
    ({"moe_k": [2, 2]}, r"moe_k \[2, 2\] is not supported"),
    ({"moe_intermediate_size": [32, 32]}, r"moe_intermediate_size \[32, 32\] is not supported"),
    ({"moe_layer_start_index": [1, 1]}, r"moe_layer_start_index \[1, 1\] is not supported"),
    ({"moe_layer_end_index": [2, 2]}, r"moe_layer_end_index \[2, 2\] is not supported"),
    # transformers divides the layer index by it
    ({"moe_layer_interval": 0}, "moe_layer_interval 0 is not supported"),
    # an explicit null transformers' model fails on (not the class default of 2)
    ({"moe_num_shared_experts": None}, "moe_num_shared_experts None is not supported"),
    ({"moe_num_experts": 0}, "moe_num_experts 0 is not supported"),
])
def test_moe_keys_refused_by_name(change, match):
    hf = load_hf_config(make_checkpoint("ernie4_5_moe"))
    if "num_experts" in change:
        hf.pop("moe_num_experts")
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


def test_class_defaults_and_end_index_pass():
    """moe_layer_end_index -1 is the last layer; absent keys take the class defaults."""
    hf = load_hf_config(make_checkpoint("ernie4_5_moe"))
    _, cfg = build_model_config({**hf, "moe_layer_end_index": -1})
    assert [cfg.moe.is_sparse(i) for i in range(3)] == [False, True, True]
    hf = {k: v for k, v in hf.items() if k not in ("moe_num_shared_experts", "moe_k")}
    _, cfg = build_model_config(hf)
    assert (cfg.moe.num_experts_per_tok, cfg.moe.shared_expert_intermediate_size) == (6, 64)
