"""Warm-start hints (worker/warm_hint.py): a start that found or stored its compile snapshot
leaves a hint keyed by the arguments that change the pieces, and a later start with such
arguments starts no warm compile children ahead; `cache ls` does not list the hints."""

from __future__ import annotations

import dataclasses
import json

import torch

from compiled_llm import LLM
from compiled_llm.compile.cache import list_entries
from compiled_llm.config import EngineArgs
from compiled_llm.worker import compile_children, warm_hint
from tests.utils import make_checkpoint


def _args(ckpt, cache_dir, **extra) -> EngineArgs:
    return EngineArgs(model=str(ckpt), dtype="float32", compile_mode="backend",
                      compile_cache_dir=str(cache_dir), **extra)


def test_the_key_follows_what_changes_the_pieces(tmp_path):
    ckpt = make_checkpoint("llama")
    args = _args(ckpt, tmp_path)
    key = warm_hint.hint_key(args)
    assert warm_hint.hint_key(_args(ckpt, tmp_path)) == key
    # serving-only limits do not change the pieces: compile and serve share a hint
    served = dataclasses.replace(args, max_num_batched_tokens=2048, max_num_seqs=64)
    assert warm_hint.hint_key(served) == key
    assert warm_hint.hint_key(dataclasses.replace(args, dtype="bfloat16")) != key
    assert warm_hint.hint_key(dataclasses.replace(args, passes={"enable_silu_mul": False})) \
        != key
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert warm_hint.hint_key(args) != key


def test_a_start_leaves_the_hint_and_the_next_starts_no_children(tmp_path, monkeypatch):
    ckpt = make_checkpoint("qwen3")
    args = _args(ckpt, tmp_path)
    assert not warm_hint.hinted_warm(args)
    llm = LLM(str(ckpt), dtype="float32", compile_mode="backend",
              compile_cache_dir=str(tmp_path), device="cpu")
    del llm
    assert warm_hint.hinted_warm(dataclasses.replace(args, device="cpu"))
    assert len(list_entries(tmp_path)) == 1  # the hints are not a cache key
    # side-by-side pieces on (opt-in on the CPU): a hinted start starts no child ahead
    monkeypatch.setenv("COMPILED_LLM_SIDE_PIECE_COMPILE", "1")
    hinted = dataclasses.replace(args, device="cpu")
    assert compile_children._start_warm(torch.device("cpu"), hinted, None) == []


def test_no_hint_without_a_compile_cache(tmp_path):
    ckpt = make_checkpoint("qwen3")
    LLM(str(ckpt), dtype="float32", enforce_eager=True, compile_cache_dir=str(tmp_path),
        device="cpu")
    args = EngineArgs(model=str(ckpt), dtype="float32", enforce_eager=True,
                      compile_cache_dir=str(tmp_path), device="cpu")
    assert not warm_hint.hinted_warm(args)
