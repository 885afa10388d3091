"""OLMo 1, OLMo 3 and OLMoE: the config keys read as transformers 5 reads them, and what the
engine refuses by name (OLMoE's tensor parallelism, OLMo 3's pipeline parallelism)."""

from __future__ import annotations

import pytest

from compiled_llm import LLM
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import make_checkpoint


def test_olmo3_legacy_rope_and_default_layer_types():
    """A legacy rope_theta / rope_scaling is the full layers' alone; the sliding layers keep
    the default rope at transformers' default base; every fourth layer attends fully."""
    hf = load_hf_config(make_checkpoint("olmo3"))
    hf = {key: value for key, value in hf.items() if key not in ("rope_parameters", "layer_types")}
    hf.update(num_hidden_layers=4, rope_theta=1e4,
              rope_scaling={"rope_type": "linear", "factor": 2.0})
    _, cfg = build_model_config(hf)
    assert (cfg.rope_theta, cfg.rope_scaling["rope_type"]) == (1e4, "linear")
    assert cfg.local_rope_theta == 500000.0
    assert cfg.sliding_window_layers == (0, 1, 2)
    with pytest.raises(ValueError, match="rope_parameters.sliding_attention.rope_type"):
        build_model_config({**hf, "rope_parameters": {
            "sliding_attention": {"rope_type": "linear", "factor": 2.0},
            "full_attention": {"rope_type": "default"}}})


def test_olmo_options_refused_by_name():
    hf = load_hf_config(make_checkpoint("olmo"))
    _, cfg = build_model_config(hf)
    assert cfg.clip_qkv == 0.5
    with pytest.raises(ValueError, match="clip_qkv must be a positive number"):
        build_model_config({**hf, "clip_qkv": -1})
    moe = load_hf_config(make_checkpoint("olmoe"))
    with pytest.raises(ValueError, match="head_dim 32 is not supported"):
        build_model_config({**moe, "head_dim": 32})
    alias = {key: value for key, value in moe.items() if key != "num_experts"}
    assert build_model_config({**alias, "num_local_experts": 4})[1].moe.num_experts == 4


@pytest.mark.parametrize(("name", "field", "match"), [
    ("olmoe", "tensor_parallel_size", "tensor_parallel_size 2: OlmoeForCausalLM's q_norm"),
    ("olmo3", "pipeline_parallel_size", "pipeline_parallel_size 2: Olmo3ForCausalLM")])
def test_parallelism_refused_by_name(name, field, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, **{field: 2})
