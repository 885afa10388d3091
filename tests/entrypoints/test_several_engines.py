"""Several engines in one process: two alive at once, stepped in turn, give each the greedy
tokens it gives alone; an engine built after another was shut down, or merely dropped, works."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = random_prompts(4, 300, lo=5, hi=40, seed=3)


@pytest.fixture(scope="module")
def ckpt() -> str:
    return str(make_checkpoint("llama"))


def build(ckpt: str, mode: str, cache_dir) -> LLM:
    """An LLM on CPU: mode "eager", or "backend" compiled into cache_dir."""
    kw = {"enforce_eager": True} if mode == "eager" else {"compile_cache_dir": str(cache_dir)}
    return LLM(ckpt, device="cpu", dtype="float32", **kw)


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def step_in_turn(llms: list[LLM]) -> list[list[list[int]]]:
    """Every prompt on every engine, the engines stepped one after another until all finish."""
    for llm in llms:
        for i, prompt in enumerate(PROMPTS):
            llm.engine.add_request(str(i), prompt, GREEDY)
    done: list[dict[str, list[int]]] = [{} for _ in llms]
    while any(llm.engine.has_unfinished_requests() for llm in llms):
        for llm, finished in zip(llms, done):
            for out in llm.engine.step():
                if out.finished:
                    finished[out.request_id] = out.outputs[0].token_ids
    return [[finished[str(i)] for i in range(len(PROMPTS))] for finished in done]


@pytest.mark.parametrize("mode", ["eager", "backend"])
def test_two_engines_at_once_match_each_alone(ckpt, tmp_path, mode):
    # separate caches: each compiled engine goes through Dynamo, beside the other's graphs
    first = build(ckpt, mode, tmp_path / "a")
    alone = tokens(first)
    second = build(ckpt, mode, tmp_path / "b")
    assert tokens(second) == alone
    assert step_in_turn([first, second]) == [alone, alone]
    assert tokens(first) == alone


@pytest.mark.parametrize("mode", ["eager", "backend"])
def test_engine_after_one_shut_down_or_dropped(ckpt, tmp_path, mode):
    first = build(ckpt, mode, tmp_path)
    alone = tokens(first)
    first.shutdown()
    after_shutdown = build(ckpt, mode, tmp_path)  # compiled: the warm snapshot
    assert tokens(after_shutdown) == alone
    del after_shutdown  # no shutdown: dropping it must do
    after_drop = build(ckpt, mode, tmp_path / "cold")  # compiled: through Dynamo again
    assert tokens(after_drop) == alone
