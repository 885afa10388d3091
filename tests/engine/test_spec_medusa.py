"""Medusa speculative decoding end to end on a tiny Llama with head checkpoints written here in
vLLM's format: greedy output token for token as without it (random heads, and heads that copy
the target's lm_head), sampled requests, metrics consistency, the refusals, the pool empty."""

# ruff: noqa: F811  (the tests take the module fixtures imported below as arguments)
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import SamplingParams
from compiled_llm.speculative import SpeculativeConfig
from tests.engine.test_spec_decode import (  # noqa: F401  (shared module fixtures)
    GREEDY,
    _llm,
    _tokens,
    baseline,
    ckpt,
    prompts,
)

NUM_HEADS = 3


def _medusa(model_dir: Path, hidden: int, vocab: int, copy_lm_head: bool = False,
            bias: bool = False, drop: str | None = None) -> str:
    """A Medusa head checkpoint: random ResBlocks and lm_heads, or zero ResBlocks and lm_heads
    copying the target's (each head then repeats the target's next-token argmax)."""
    torch.manual_seed(1)
    target = load_file(model_dir / "model.safetensors")
    lm_head = target.get("lm_head.weight", target["model.embed_tokens.weight"])
    tensors = {}
    for head in range(NUM_HEADS):
        weight = torch.randn(hidden, hidden) * 0.1
        tensors[f"blocks.{head}.layers.0.weight"] = weight * (0 if copy_lm_head else 1)
        if bias:
            tensors[f"blocks.{head}.layers.0.bias"] = torch.randn(hidden) * 0.1
        tensors[f"lm_heads.{head}.weight"] = (lm_head.clone() if copy_lm_head
                                             else torch.randn(vocab, hidden) * 0.1)
    tensors.pop(drop, None)
    out = Path(tempfile.mkdtemp(prefix="cllm-medusa-"))
    save_file(tensors, out / "model.safetensors")
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": NUM_HEADS,
              "num_hidden_layers": 1, "hidden_size": hidden, "vocab_size": vocab,
              "medusa_fc_bias": bias}
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def _spec(heads: str, k: int = NUM_HEADS) -> dict:
    return {"method": "medusa", "model": heads, "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def shape(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    return config["hidden_size"], config["vocab_size"]


def _check_metrics(llm):
    metrics = {m.name: m for m in llm.get_metrics()}
    stats = llm.engine.scheduler.spec_stats
    assert stats.num_drafts > 0
    assert metrics["vllm:spec_decode_num_drafts"].value == stats.num_drafts
    assert metrics["vllm:spec_decode_num_draft_tokens"].value == stats.num_draft_tokens
    assert stats.num_accepted_tokens <= stats.num_draft_tokens <= NUM_HEADS * stats.num_drafts
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    assert sum(per_pos) == stats.num_accepted_tokens
    assert list(per_pos) == sorted(per_pos, reverse=True)


@pytest.mark.parametrize("copy_lm_head", [False, True], ids=["random", "copied-lm-head"])
def test_medusa_greedy_equals_spec_off(ckpt, shape, prompts, baseline, copy_lm_head):
    heads = _medusa(ckpt, *shape, copy_lm_head=copy_lm_head, bias=not copy_lm_head)
    llm = _llm(ckpt, speculative_config=_spec(heads))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    _check_metrics(llm)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    first = _tokens(llm.generate(prompts[:2], sampled, use_tqdm=False))
    assert all(len(tokens) == 12 for tokens in first)
    assert _tokens(llm.generate(prompts[:2], sampled, use_tqdm=False)) == first
    assert llm.engine.num_used_blocks == 0


def test_medusa_refusals(ckpt, shape):
    hidden, vocab = shape
    heads = _medusa(ckpt, hidden, vocab)
    with pytest.raises(ValueError, match="num_speculative_tokens.*num_heads"):
        _llm(ckpt, speculative_config=_spec(heads, k=NUM_HEADS + 1))
    bad = Path(_medusa(ckpt, hidden, vocab))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "hidden_size": hidden * 2}))
    with pytest.raises(ValueError, match="speculative_config.model.*hidden_size"):
        _llm(ckpt, speculative_config=_spec(str(bad)))
    (bad / "config.json").write_text(json.dumps({**config, "vocab_size": vocab + 1}))
    with pytest.raises(ValueError, match="speculative_config.model.*vocab_size"):
        _llm(ckpt, speculative_config=_spec(str(bad)))
    partial = _medusa(ckpt, hidden, vocab, drop="lm_heads.2.weight")
    with pytest.raises(ValueError, match="speculative_config.model.*lacks.*lm_heads.2"):
        _llm(ckpt, speculative_config=_spec(partial))
    with pytest.raises(ValueError, match="speculative_config.model.*config.json"):
        _llm(ckpt, speculative_config=_spec(tempfile.mkdtemp()))
    with pytest.raises(ValueError, match="speculative_config.model.*required"):
        SpeculativeConfig.from_dict({"method": "medusa", "num_speculative_tokens": 2})
    for method in ("mtp", "deepseek_mtp"):
        with pytest.raises(ValueError, match="not supported yet"):
            SpeculativeConfig.from_dict({"method": method, "model": heads,
                                         "num_speculative_tokens": 2})
