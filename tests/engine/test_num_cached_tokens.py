"""RequestOutput.num_cached_tokens (vLLM's): the prompt tokens a request's first admission took
from the prefix cache, set by the KV manager, kept across a preemption, carried on the core's
outputs (across the engine-core process boundary too, as a request's cache_salt crosses it)
and reported to the user; AsyncLLM built from vLLM's AsyncEngineArgs, with bad_words and
prompt-key checks in that process set-up."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from compiled_llm import AsyncEngineArgs, AsyncLLM, SamplingParams
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request
from tests.utils import make_checkpoint

BLOCK = 4


def _req(rid: str, num_tokens: int) -> Request:
    return Request(rid, list(range(1, num_tokens + 1)), SamplingParams())


def test_first_admission_records_its_prefix_hits_and_a_readmission_keeps_them():
    kv = KVCacheManager(num_blocks=16, block_size=BLOCK)
    first = _req("a", 10)
    assert first.num_cached_tokens == -1  # not admitted yet
    assert kv.allocate_slots(first, 10, kv.get_computed_blocks(first))
    assert first.num_cached_tokens == 0
    second = _req("b", 10)
    hits = kv.get_computed_blocks(second)
    assert kv.allocate_slots(second, 10 - len(hits) * BLOCK, hits)
    assert second.num_cached_tokens == 2 * BLOCK  # (10 - 1) // 4 full blocks
    kv.free(second)  # preempted: recomputed later, maybe with other hits
    second.num_computed_tokens = 0
    kv.free(first)
    kv.reset_prefix_cache()
    assert kv.allocate_slots(second, 10, kv.get_computed_blocks(second))
    assert second.num_cached_tokens == 2 * BLOCK  # vLLM: the first admission's count


def test_the_count_crosses_the_wire():
    out = EngineCoreOutput("r", [5], finish_reason="stop", num_cached_tokens=32)
    back = EngineCoreOutput.from_wire(list(out.to_wire()))
    assert back.num_cached_tokens == 32 and back.finish_reason == "stop"


def test_an_engine_core_process_reports_prefix_cache_hits(caplog):
    args = AsyncEngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True,
                           dtype="float32", device="cpu", engine_core_process=True,
                           block_size=16, enable_log_requests=True)
    engine = AsyncLLM.from_engine_args(args)
    prompt = {"prompt_token_ids": list(range(5, 45))}  # 40 tokens: 2 full blocks reusable
    params = SamplingParams(temperature=0.0, max_tokens=2)

    async def final(rid: str, sampling: SamplingParams = params, base: dict = prompt, **salt):
        last = None
        async for out in engine.generate({**base, **salt}, sampling, rid):
            last = out
        return last

    try:
        with caplog.at_level("INFO", logger="compiled_llm.entrypoints.async_llm"):
            first = asyncio.run(final("a"))
        assert "Received request a: params:" in caplog.text  # vLLM's enable_log_requests
        second = asyncio.run(final("b"))
        # a cache_salt crosses to the core process with its request: only the same salt hits
        salted = [asyncio.run(final(f"s{i}", cache_salt=s)) for i, s in enumerate("AAB")]
        # a text prompt, tokenized ahead of the engine, keeps its salt
        text = {"prompt": "The quick brown fox jumps over the lazy dog. " * 4}
        texts = [asyncio.run(final(f"t{i}", base=text, **salt))
                 for i, salt in enumerate([{}, {"cache_salt": "T"}, {"cache_salt": "T"}])]
        with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
            asyncio.run(engine.add_request("u", {**text, "cache_salt": 7}))
        # bad_words travel to the core process as a logits processor: "is" (one token, 259),
        # pushed to the top by logit_bias, stays banned there
        ban = SamplingParams(temperature=0.0, max_tokens=3, logit_bias={259: 100.0})
        forced = asyncio.run(final("c", ban))
        banned = asyncio.run(final("d", dataclasses.replace(ban, bad_words=["is"])))
        # a text prompt is tokenized ahead into a new dict: its other keys are refused first
        with pytest.raises(ValueError, match="'multi_modal_data' is not supported"):
            asyncio.run(engine.add_request("e", {"prompt": "hi", "multi_modal_data": {}}))
    finally:
        engine.shutdown()
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 32
    assert [out.num_cached_tokens for out in salted] == [0, 32, 0]
    assert texts[1].num_cached_tokens == 0 and texts[2].num_cached_tokens > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert forced.outputs[0].token_ids == [259] * 3
    assert 259 not in banned.outputs[0].token_ids
