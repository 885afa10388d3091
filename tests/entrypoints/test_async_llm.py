"""AsyncLLM: streamed deltas agree with cumulative and final outputs, stop-string prefixes are
held back, requests share steps, cancelling a consumer frees its blocks at once, and an abort
by id ends the consumer waiting on it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from compiled_llm import SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.output.detokenizer import IncrementalDetokenizer
from compiled_llm.sampling_params import RequestOutputKind as Kind
from tests.utils import make_checkpoint


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(EngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True,
                              dtype="float32"))
    yield eng
    eng.shutdown()


def _params(kind: Kind, **kw) -> SamplingParams:
    kw = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True, **kw}
    return SamplingParams(output_kind=kind, **kw)


async def _collect(engine, rid: str, kind: Kind, **kw):
    return [o async for o in engine.generate("The quick brown", _params(kind, **kw), rid)]


def test_output_kinds_agree(engine):
    async def main():
        return await asyncio.gather(*[_collect(engine, f"k{k.name}", k) for k in Kind])

    cumulative, delta, final = asyncio.run(main())
    assert len(final) == 1 and final[0].finished
    want = final[0].outputs[0]
    assert "".join(o.outputs[0].text for o in delta) == want.text
    assert sum((o.outputs[0].token_ids for o in delta), []) == want.token_ids
    assert cumulative[-1].outputs[0].text == want.text
    assert all(want.text.startswith(o.outputs[0].text) for o in cumulative)
    assert engine.engine.num_used_blocks == 0


def test_stop_prefix_held_back(engine):
    async def main():
        full = (await _collect(engine, "s0", Kind.FINAL_ONLY))[0].outputs[0].text
        stop = full[len(full) // 2: len(full) // 2 + 4]
        parts = await _collect(engine, "s1", Kind.CUMULATIVE, stop=[stop])
        return full, stop, parts

    full, stop, parts = asyncio.run(main())
    cut = full[: full.index(stop)]
    assert parts[-1].outputs[0].text == cut and parts[-1].outputs[0].finish_reason == "stop"
    assert all(cut.startswith(p.outputs[0].text) for p in parts)  # never past the cut


def test_concurrent_requests_share_steps(engine):
    seen = []

    async def one(i: int):
        # long enough that the adds (each a tokenizer and an engine-thread hop) overlap
        async for _ in engine.generate(f"Prompt {i}", _params(Kind.DELTA, max_tokens=128),
                                       f"c{i}"):
            seen.append(engine.stats.num_running)

    async def main():
        await asyncio.gather(*[one(i) for i in range(16)])

    asyncio.run(main())
    assert max(seen) >= 8
    assert engine.engine.num_used_blocks == 0


async def _busy_for_long(engine, seconds: float = 10.0) -> bool:
    """Whether the engine still has unfinished requests after seconds: a step launched before
    an abort is read after it (async scheduling), later on a loaded machine."""
    deadline = time.monotonic() + seconds
    while await engine.call(engine.engine.has_unfinished_requests):
        if time.monotonic() > deadline:
            return True
        await asyncio.sleep(0.01)
    return False


def test_cancel_frees_blocks_at_once_and_bad_input_queues_nothing(engine):
    async def main():
        gen = engine.generate("The quick", _params(Kind.DELTA, max_tokens=400), "cancel")
        async for _ in gen:
            break
        await gen.aclose()
        # commands run in order on the loop thread: the abort came first
        used = await engine.call(lambda: engine.engine.num_used_blocks)
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.add_request("long", list(range(1, 300)) * 2, SamplingParams())
        busy = await _busy_for_long(engine)
        task = asyncio.ensure_future(_collect(engine, "task", Kind.DELTA, max_tokens=400))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        after_cancel = await engine.call(lambda: engine.engine.num_used_blocks)
        return used, busy, after_cancel

    assert asyncio.run(main()) == (0, False, 0)


def test_abort_by_id_ends_a_waiting_consumer(engine):
    """vLLM's AsyncLLM.abort(ids): one id or several; a consumer waiting on one stops."""
    started = {rid: asyncio.Event() for rid in ("a1", "a2", "a3")}

    async def consume(rid: str) -> int:
        count = 0
        async for _ in engine.generate("The quick", _params(Kind.DELTA, max_tokens=400), rid):
            count += 1
            started[rid].set()
        return count

    async def main():
        tasks = [asyncio.ensure_future(consume(rid)) for rid in started]
        for event in started.values():
            await event.wait()
        await engine.abort("a1")
        await engine.abort(["a2", "a3", "gone"])
        counts = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        used = await engine.call(lambda: engine.engine.num_used_blocks)
        return counts, used

    counts, used = asyncio.run(main())
    assert all(1 <= count < 400 for count in counts) and used == 0


@pytest.mark.parametrize("kind", list(Kind))
def test_abort_by_id_yields_a_final_abort_output(engine, kind):
    """As vLLM's AsyncLLM: after abort(id) the consumer gets one last output, finished, with
    finish_reason "abort" on every sequence; its text is what the tokens so far decode to."""
    rid, started = f"fin-{kind.name}", asyncio.Event()

    async def consume() -> list:
        outs = []
        params = _params(kind, max_tokens=400, n=2, temperature=0.8, seed=1)
        async for out in engine.generate("The quick", params, rid):
            outs.append(out)
            started.set()
        return outs

    async def main():
        task = asyncio.ensure_future(consume())
        if kind is Kind.FINAL_ONLY:  # nothing comes before the end: wait for some tokens
            states = engine.engine.outputs.states
            def two_have_tokens() -> bool:
                return sum(bool(s.output_token_ids) for s in states.values()
                           if s.parent_id == rid) == 2

            while not await engine.call(two_have_tokens):
                await asyncio.sleep(0.01)
        else:
            await started.wait()
        await engine.abort(rid)
        outs = await asyncio.wait_for(task, timeout=30)
        return outs, await engine.call(lambda: engine.engine.num_used_blocks)

    outs, used = asyncio.run(main())
    last = outs[-1]
    assert last.finished and used == 0
    assert sorted(seq.index for seq in last.outputs) == [0, 1]
    assert all(seq.finish_reason == "abort" for seq in last.outputs)
    if kind is not Kind.DELTA:  # the whole output so far, text made for FINAL_ONLY too
        prompt = engine.tokenizer.encode("The quick")
        for seq in last.outputs:
            # the text streaming would have built (vLLM's incremental detokenizer): a
            # character whose bytes are not all out yet is held back, and a run of byte
            # tokens that proves invalid UTF-8 stays as it streamed
            det = IncrementalDetokenizer(engine.tokenizer, prompt, True, True)
            det.add_tokens(list(seq.token_ids))
            assert seq.token_ids and seq.text == det.output_text


def test_row7_text_prompts_are_tokenized_off_the_engine_thread(engine):
    threads = []
    real = engine.tokenizer.encode

    def spy(*args, **kwargs):  # records where the real tokenizer runs
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    async def main():
        outs = await _collect(engine, "text", Kind.FINAL_ONLY, max_tokens=4)
        with pytest.raises(ValueError, match="^prompt is .* bytes"):
            await engine.add_request("huge", "x" * (engine.max_prompt_bytes + 1))
        return outs

    engine.tokenizer.encode = spy
    try:
        outs = asyncio.run(main())
    finally:
        del engine.tokenizer.encode
    assert outs[-1].prompt == "The quick brown" and outs[-1].error is None
    assert threads and all(name.startswith("tokenizer") for name in threads), threads
    assert len(threads) == 1  # the oversized prompt was refused before any tokenizer time
    assert engine.engine.num_used_blocks == 0


def test_row2_a_slow_grammar_compiles_off_the_engine_thread_and_is_refused_in_time():
    from tests.sample.test_grammar_compiler import SLOW

    engine = AsyncLLM(EngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True,
                                 dtype="float32", structured_outputs_timeout_s=0.3))
    healthy_tokens = []

    async def healthy():
        async for out in engine.generate("The quick", _params(Kind.DELTA, max_tokens=400),
                                         "healthy"):
            healthy_tokens.extend(out.outputs[0].token_ids)

    async def main():
        task = asyncio.ensure_future(healthy())
        while not healthy_tokens and not task.done():  # a failed stream ends the wait
            await asyncio.sleep(0.01)
        before = len(healthy_tokens)
        with pytest.raises(ValueError, match="did not compile within 0.3 s"):
            await engine.add_request("hostile", "x", SamplingParams(structured_outputs=SLOW))
        during = len(healthy_tokens) - before
        await task
        return during

    try:
        during = asyncio.run(main())
        assert during > 0  # the engine kept stepping while the grammar compiled
        assert len(healthy_tokens) == 400
        assert engine.engine.num_used_blocks == 0 and "hostile" not in engine.engine.parents
    finally:
        engine.shutdown()


def test_row11_a_caller_that_leaves_before_its_command_runs_leaves_the_loop_alive(engine):
    async def main():
        release = threading.Event()
        blocker = asyncio.ensure_future(engine.call(release.wait))  # holds the engine thread
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(engine.call(lambda: "never run"))
        await asyncio.sleep(0.05)
        gone.cancel()  # as when a client disconnects while its request is being admitted
        await asyncio.gather(gone, return_exceptions=True)
        release.set()
        await blocker
        return await asyncio.wait_for(engine.call(lambda: "alive"), timeout=30)

    assert asyncio.run(main()) == "alive" and engine.error is None


def test_vllm_engine_client_methods():
    """get_tokenizer, is_running / is_stopped / errored, check_health, reset_prefix_cache;
    after shutdown a request gets "engine is shut down"."""
    eng = AsyncLLM(EngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True,
                              dtype="float32"))

    async def live():
        assert await eng.get_tokenizer() is eng.tokenizer
        await eng.check_health()
        return eng.is_running, eng.is_stopped, eng.errored, await eng.reset_prefix_cache()

    try:
        assert asyncio.run(live()) == (True, False, False, True)
    finally:
        eng.shutdown()
    assert eng.is_stopped and not eng.is_running
    with pytest.raises(RuntimeError, match="engine is shut down"):
        asyncio.run(eng.add_request("late", "The quick", SamplingParams(max_tokens=2)))
    with pytest.raises(RuntimeError, match="engine is shut down"):
        asyncio.run(eng.check_health())


def test_model_config_and_tokenizer_as_vllms_async_llm(engine):
    import transformers

    hf = transformers.AutoConfig.from_pretrained(engine.engine.args.model)

    async def main():
        return await engine.get_model_config(), await engine.get_tokenizer()

    config, tokenizer = asyncio.run(main())
    assert config is engine.model_config is engine.engine.model_config
    assert config.get_vocab_size() == hf.vocab_size and config.max_model_len > 0
    assert config.dtype == torch.float32 and tokenizer is engine.tokenizer


def test_encode_is_vllms_pooling_call_and_refused_on_a_generative_model(engine):
    from compiled_llm.pooling_params import PoolingParams

    async def main():
        return [o async for o in engine.encode("The quick", PoolingParams(), "e0")]

    with pytest.raises(ValueError, match="runner='pooling'"):
        asyncio.run(main())
    assert asyncio.run(engine.encode_text("The quick")) == engine.tokenizer.encode("The quick")
