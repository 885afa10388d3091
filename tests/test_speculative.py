"""speculative_config as vLLM spells it: accepted shapes, refusals naming the field, the CLI."""

from __future__ import annotations

import argparse

import pytest

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.args import add_engine_args, engine_args
from compiled_llm.speculative import SpeculativeConfig, speculative_config_of


def test_ngram_and_draft_model_parse():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert (cfg.method, cfg.num_speculative_tokens) == ("ngram", 3)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (2, 4)
    only_max = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 1,
                                            "prompt_lookup_max": 3})
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    draft = SpeculativeConfig.from_dict({"model": "/d", "num_speculative_tokens": 2})
    assert (draft.method, draft.model) == ("draft_model", "/d")
    assert speculative_config_of(None) is None
    limited = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2,
                                           "disable_by_batch_size": 32})
    assert (limited.disable_by_batch_size, cfg.disable_by_batch_size) == (32, None)


@pytest.mark.parametrize("spec, field", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "model"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "model"),
    ({"method": "mtp", "model": "/d", "num_speculative_tokens": 2}, "method"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "model"),
    ({"method": "bogus", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": "4"},
     "prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "lookahead"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 1},
     "disable_by_batch_size"),
    ({"method": "draft_model", "model": "/d", "num_speculative_tokens": 2,
      "disable_by_batch_size": 8}, "disable_by_batch_size"),
])
def test_bad_fields_are_refused_by_name(spec, field):
    with pytest.raises(ValueError, match=f"speculative_config.*{field}"):
        EngineArgs(speculative_config=spec)


def test_cli_flag_takes_the_json():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args(parser.parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}']))
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 5}
    with pytest.raises(ValueError, match="speculative_config.method"):
        engine_args(parser.parse_args(
            ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 5}']))


def test_pooling_refuses_speculative_config():
    from compiled_llm.engine.pooling_engine import check_pooling_args

    with pytest.raises(ValueError, match="speculative_config"):
        check_pooling_args(EngineArgs(speculative_config={"method": "ngram",
                                                          "num_speculative_tokens": 2}))


def test_lora_with_speculative_config_is_refused():
    with pytest.raises(ValueError, match="speculative_config"):
        EngineArgs(enable_lora=True, speculative_config={"method": "ngram",
                                                         "num_speculative_tokens": 2})


@pytest.mark.parametrize("spec, method, model", [
    # vLLM's EAGLE example: draft_tensor_parallel_size 1 and the head's name
    ({"method": "eagle", "model": "/m/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 2,
      "draft_tensor_parallel_size": 1}, "eagle", "/m/EAGLE-LLaMA3-Instruct-8B"),
    ({"model": "/m/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 2}, "eagle",
     "/m/EAGLE-LLaMA3-Instruct-8B"),
    ({"model": "/m/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 2}, "eagle3",
     "/m/EAGLE3-LLaMA3.1-Instruct-8B"),
    ({"model": "ngram", "num_speculative_tokens": 2}, "ngram", None),
    ({"model": "[ngram]", "num_speculative_tokens": 2}, "ngram", None),
    ({"method": "[ngram]", "num_speculative_tokens": 2}, "ngram", None),
    ({"method": "ngram", "model": "ngram", "num_speculative_tokens": 2}, "ngram", None),
    ({"method": "ngram", "num_speculative_tokens": 2, "enforce_eager": True,
      "disable_padded_drafter_batch": False, "quantization": None, "revision": None,
      "max_model_len": None, "draft_tensor_parallel_size": None}, "ngram", None),
])
def test_vllm_spellings_are_taken(spec, method, model):
    cfg = speculative_config_of(EngineArgs(speculative_config=spec).speculative_config)
    assert (cfg.method, cfg.model) == (method, model)


def test_medusa_heads_are_recognised_by_their_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "medusa", "num_heads": 3}')
    cfg = SpeculativeConfig.from_dict({"model": str(tmp_path), "num_speculative_tokens": 2})
    assert cfg.method == "medusa"


@pytest.mark.parametrize("spec, field", [
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": True},
     "draft_tensor_parallel_size"),
    ({"model": "/d", "num_speculative_tokens": 2, "max_model_len": 64}, "max_model_len"),
    ({"model": "/d", "num_speculative_tokens": 2, "quantization": "fp8"}, "quantization"),
    ({"method": "ngram", "num_speculative_tokens": 2, "enforce_eager": "yes"}, "enforce_eager"),
    ({"method": "dflash", "model": "/d", "num_speculative_tokens": 2}, "method"),
])
def test_vllm_fields_that_would_change_something_are_refused_by_name(spec, field):
    with pytest.raises(ValueError, match=f"speculative_config.{field}"):
        EngineArgs(speculative_config=spec)
