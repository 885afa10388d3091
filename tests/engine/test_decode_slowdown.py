"""max_decode_slowdown through the engine: the same greedy tokens as without it (the cap only
moves prompt tokens between steps), no KV block left held, and a slowdown the engine refuses."""

from __future__ import annotations

import pytest

from compiled_llm import LLM
from tests.engine.test_async_scheduling import GREEDY, _llm, _tokens
from tests.utils import make_checkpoint, random_prompts


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_same_tokens_with_the_prefill_cap(ckpt, async_scheduling):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(8, 300, lo=5, hi=120)]
    baseline = _tokens(_llm(ckpt, max_num_batched_tokens=128).generate(prompts, GREEDY,
                                                                       use_tqdm=False))
    llm = _llm(ckpt, max_num_batched_tokens=128, max_decode_slowdown=1.2,
               async_scheduling=async_scheduling)
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert llm.engine.num_used_blocks == 0


def test_a_bad_slowdown_is_refused(ckpt):
    with pytest.raises(ValueError, match="max_decode_slowdown"):
        LLM(str(ckpt), enforce_eager=True, max_decode_slowdown=0.9)


def test_the_engine_learns_a_cap_from_its_steps(ckpt):
    """A second generate's steps carry decodes beside big prompt chunks: the cost model
    learns a token's cost there and the scheduler gets a cap (the tokens stay the same).
    Step by step: on the CPU an async launch runs the forward, so the time between two
    landings is the next step's (on a GPU the launch returns at once)."""
    # not the same: no prefix-cache hits the second time; 16 prompts give several steps of
    # decodes beside big chunks (one alone could time under a decode step on a loaded machine)
    first, second = ([{"prompt_token_ids": p} for p in random_prompts(16, 300, 400, 401, seed)]
                     for seed in (0, 1))
    llm = _llm(ckpt, max_num_batched_tokens=1500, max_decode_slowdown=2.0)
    llm.generate(first, GREEDY, use_tqdm=False)
    baseline = _tokens(_llm(ckpt, max_num_batched_tokens=1500).generate(second, GREEDY,
                                                                         use_tqdm=False))
    assert _tokens(llm.generate(second, GREEDY, use_tqdm=False)) == baseline
    core = llm.engine.core
    assert core._step_cost.decode_s is not None and core._step_cost.token_s is not None
    assert core.scheduler.prefill_cap is not None
    assert llm.engine.num_used_blocks == 0
