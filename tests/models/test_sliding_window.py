"""Sliding windows on MoE models read as transformers reads them: an older Qwen2-MoE
config.json (no layer_types) and Qwen3-MoE (window on every layer, max_window_layers and
layer_types ignored); greedy tokens equal transformers' on prompts longer than the window."""

from __future__ import annotations

import json
import shutil

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import hf_greedy, make_checkpoint, random_prompts

NEW_TOKENS = 12


def _old_config(name: str, dest, **changes):
    """A copy of checkpoint `name` whose config.json drops layer_types and sets changes."""
    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("layer_types", None)
    (out / "config.json").write_text(json.dumps({**cfg, **changes}))
    return out


@pytest.fixture(scope="module", params=["qwen2_moe_window", "qwen3_moe_window"])
def old_checkpoint(request, tmp_path_factory):
    return _old_config(request.param, tmp_path_factory.mktemp("old"))


def test_windows_follow_transformers(old_checkpoint):
    import transformers

    hf = transformers.AutoConfig.from_pretrained(old_checkpoint)
    llm = LLM(str(old_checkpoint), enforce_eager=True, dtype="float32")
    if hf.model_type == "qwen2_moe":  # HF derives layer_types: even layers below 3 slide
        assert hf.layer_types == ["sliding_attention", "full_attention"] * 2
    prompts = random_prompts(4, llm.engine.model_config.vocab_size, lo=20, hi=40)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(old_checkpoint, prompts,
                                                               NEW_TOKENS)
    assert llm.engine.num_used_blocks == 0
