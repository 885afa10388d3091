"""Default sampling parameters from the model's generation_config.json (vLLM's
generation_config="auto"): read, overridden, refused when bad, and used by LLM.generate when no
SamplingParams are given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.engine.generation_defaults import generation_defaults, max_tokens_cap
from tests.utils import make_checkpoint


def with_generation_config(tmp_path: Path, fields: dict) -> Path:
    """A copy of the tiny test checkpoint whose generation_config.json also holds fields."""
    model = tmp_path / "model"
    shutil.copytree(make_checkpoint("llama"), model)
    path = model / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, **fields}))
    return model


def test_auto_reads_the_sampling_fields_and_max_new_tokens(tmp_path):
    model = with_generation_config(tmp_path, {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                              "max_new_tokens": 7, "do_sample": True})
    fields = generation_defaults(str(model))
    assert fields == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 7}
    assert max_tokens_cap("auto", None, fields) is None  # auto's max only fills in a default
    assert generation_defaults(str(model), "vllm") == {}


def test_overrides_win_and_a_directory_source_caps_max_tokens(tmp_path):
    model = with_generation_config(tmp_path, {"temperature": 0.6, "max_new_tokens": 9})
    fields = generation_defaults(str(model), "auto", {"temperature": 0.2, "min_p": 0.1})
    assert fields == {"temperature": 0.2, "min_p": 0.1, "max_tokens": 9}
    other = generation_defaults("/nonexistent", str(model))
    assert other["max_tokens"] == 9 and max_tokens_cap(str(model), None, other) == 9
    assert max_tokens_cap("auto", {"max_new_tokens": 4}, fields) == 4


def test_bad_settings_name_the_field(tmp_path):
    model = with_generation_config(tmp_path, {"temperature": -1.0})
    with pytest.raises(ValueError, match="generation_config"):
        generation_defaults(str(model))
    with pytest.raises(ValueError, match="generation_config must be auto, vllm or a directory"):
        generation_defaults(str(model), str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="override_generation_config: unknown keys"):
        generation_defaults(str(model), "auto", {"temprature": 0.5})
    with pytest.raises(ValueError, match="override_generation_config"):
        LLM(model=str(model), generation_config="vllm",
            override_generation_config={"beams": 2}, enforce_eager=True)


def test_generate_without_params_samples_with_the_models_defaults(tmp_path):
    # top_k 1 makes the model's default sampling greedy whatever its temperature
    model = with_generation_config(tmp_path, {"temperature": 0.9, "top_k": 1,
                                              "max_new_tokens": 5})
    prompt = {"prompt_token_ids": [3, 14, 15, 92, 65]}
    llm = LLM(model=str(model), enforce_eager=True, dtype="float32",
              kv_cache_memory_bytes=16 << 20)
    try:
        defaults = llm.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.9, 1, 5)
        out = llm.generate([prompt], use_tqdm=False)[0].outputs[0].token_ids
        greedy = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5),
                              use_tqdm=False)[0].outputs[0].token_ids
        assert list(out) == list(greedy) and len(out) == 5
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()
    plain = LLM(model=str(model), generation_config="vllm", enforce_eager=True,
                dtype="float32", kv_cache_memory_bytes=16 << 20)
    try:
        assert plain.get_default_sampling_params() == SamplingParams()
    finally:
        plain.shutdown()
