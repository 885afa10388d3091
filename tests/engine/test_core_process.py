"""The engine core in its own process: same tokens as the in-process core, every request
answered, a crash detected (errors, not hangs, and an unhealthy server), a new engine after
one, a clean shutdown, no orphan when the front end is killed, no KV blocks left."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from compiled_llm import LLM, AsyncLLM, SamplingParams
from compiled_llm.engine.core_client import CoreClient, EngineDeadError
from tests.entrypoints.server.inprocess import MODEL, engine_args, serving

PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "Hello"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


async def _collect(engine: AsyncLLM, prompt: str, params: SamplingParams, rid: str,
                   started: asyncio.Event | None = None):
    final = None
    async for out in engine.generate(prompt, params, rid):
        if started is not None:
            started.set()
        final = out
    return final


def test_seed_makes_unseeded_sampling_repeat_in_the_core_process():
    """EngineArgs.seed seeds the process that samples: two engines whose cores run in
    processes of their own, and one in-process core, draw the same unseeded samples. (One
    request: which requests share a step, and so the draws, follows their arrival.)"""
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)

    def sample(core_process: bool) -> list[int]:
        with LLM(**vars(engine_args(seed=7, engine_core_process=core_process))) as llm:
            return llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].token_ids

    first = sample(True)
    assert sample(True) == first
    assert sample(False) == first


def test_process_core_matches_in_process_core_and_frees_everything(monkeypatch):
    monkeypatch.delenv("COMPILED_LLM_EARLY_LOAD", raising=False)  # the default: on
    with LLM(**vars(engine_args())) as llm:
        expected = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    engine = AsyncLLM(engine_args())
    core = engine.engine.core
    assert isinstance(core, CoreClient)

    async def run():
        return await asyncio.gather(*[_collect(engine, p, GREEDY, str(i))
                                      for i, p in enumerate(PROMPTS)])

    try:
        got = [o.outputs[0] for o in asyncio.run(run())]
        assert [o.token_ids for o in got] == [o.token_ids for o in expected]
        assert [o.text for o in got] == [o.text for o in expected]
        # the core loaded its weights beside its compiler imports, and its worker took them
        assert engine.engine.startup_seconds["weights_early"] > 0
        deadline = time.monotonic() + 10
        while engine.engine.get_stats().num_used_blocks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.engine.get_stats().num_used_blocks == 0
    finally:
        engine.shutdown()
    assert core.process.returncode == 0  # asked to stop, it stopped by itself
    assert not os.path.exists(core._dir)  # its sockets are gone


def test_a_dropped_llm_stops_its_core_process():
    """del llm without shutdown(), the collector off: the core process (which holds the model
    and the KV cache) is asked to stop, and stops, and its sockets' directory goes."""
    import gc

    llm = LLM(**{**vars(engine_args()), "engine_core_process": True})
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    process, directory = llm.engine.core.process, llm.engine.core._dir
    gc.disable()
    try:
        del llm
    finally:
        gc.enable()
    assert process.returncode == 0 and not _alive(process.pid)
    assert not os.path.exists(directory)


def test_a_dropped_async_llm_stops_its_loop_and_core():
    """An AsyncLLM dropped without shutdown() after serving: its loop thread ends and its
    core process stops (the thread holds it only within a turn of its loop)."""
    import gc

    engine = AsyncLLM(engine_args())
    asyncio.run(_collect(engine, PROMPTS[0], GREEDY, "only"))
    thread, process = engine._thread, engine.engine.core.process
    del engine
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert process.returncode == 0 and not _alive(process.pid)


def test_a_crashed_core_fails_every_request_and_the_server_reports_unhealthy():
    long = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)  # to max_model_len
    with serving() as srv:
        engine = srv.engine
        core = engine.engine.core

        async def run():
            started = [asyncio.Event() for _ in PROMPTS]
            tasks = [asyncio.create_task(_collect(engine, p, long, str(i), started[i]))
                     for i, p in enumerate(PROMPTS)]
            # killed once every request streams, hundreds of tokens before any can finish
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 30)
            os.kill(core.process.pid, signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

        results = asyncio.run(run())
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert "engine core process died" in str(results[0])
        health = httpx.get(f"{srv.url}/health", timeout=10)
        assert health.status_code == 503
        reply = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_dead"
    # a new engine starts and serves after the crash
    with serving() as srv:
        reply = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})
        assert reply.status_code == 200 and reply.json()["model"] == MODEL


def test_a_model_registered_at_runtime_reaches_the_core_process(tmp_path, monkeypatch):
    from compiled_llm import ModelRegistry
    from tests.models.test_plugins import MyLlamaForCausalLM, renamed_checkpoint

    monkeypatch.setattr(ModelRegistry, "models", dict(ModelRegistry.models))
    ModelRegistry.register_model("MyLlamaForCausalLM", MyLlamaForCausalLM)
    ckpt = renamed_checkpoint(tmp_path, "MyLlamaForCausalLM")
    engine = AsyncLLM(engine_args(model=str(ckpt)))
    try:
        out = asyncio.run(_collect(engine, PROMPTS[0], GREEDY, "a"))
        assert len(out.outputs[0].token_ids) == GREEDY.max_tokens
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_no_orphan_core_when_the_front_end_is_killed():
    script = textwrap.dedent("""
        from compiled_llm import AsyncLLM
        from tests.entrypoints.server.inprocess import engine_args
        engine = AsyncLLM(engine_args())
        print("CORE", engine.engine.core.process.pid, flush=True)
        import time; time.sleep(600)
    """)
    front = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        line = ""
        while not line.startswith("CORE "):
            line = front.stdout.readline()
            assert line, "the front end exited before its core started"
        core_pid = int(line.split()[1])
        assert _alive(core_pid)
        front.kill()
        front.wait()
        deadline = time.monotonic() + 15
        while _alive(core_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(core_pid), "the engine core outlived its front end"
    finally:
        front.kill()


def test_a_core_process_shutdown_prints_no_leak_report():
    """The core freezes its start-up heap; it thaws it on the way out, so the interpreter's
    teardown collects it and Triton's nanobind module has no leaked instances to report."""
    script = textwrap.dedent("""
        from compiled_llm import AsyncLLM
        from tests.entrypoints.server.inprocess import engine_args
        AsyncLLM(engine_args()).shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "leaked" not in done.stderr, done.stderr[-3000:]


def _fails_to_load():
    raise ModuleNotFoundError("no module named 'users_script'")


class _LoadsNowhere:
    """A logits processor that pickles but does not load in another process (as one whose
    module the core cannot import)."""

    def __call__(self, output_ids, logits):
        return logits

    def __reduce__(self):
        return _fails_to_load, ()


def test_a_logits_processor_the_core_cannot_load_fails_only_its_request():
    """A processor from the user's __main__ is refused by the front end, naming the field; one
    that pickles but does not load in the core fails its own request alone; the core serves on
    and holds no block."""
    def from_main(output_ids, logits):
        return logits

    from_main.__module__ = "__main__"
    with LLM(**vars(engine_args(engine_core_process=True))) as llm:
        with pytest.raises(ValueError, match="logits_processors.*__main__"):
            llm.generate(PROMPTS[0], SamplingParams(max_tokens=3,
                                                    logits_processors=[from_main]))
        params = [GREEDY] * 3
        params[1] = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                   logits_processors=[_LoadsNowhere()])
        outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
        assert outs[1].outputs[0].finish_reason == "error"
        assert "logits_processors do not load" in outs[1].error
        assert [len(outs[i].outputs[0].token_ids) for i in (0, 2)] == [12, 12]
        again = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
        assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
        assert llm.engine.num_used_blocks == 0
