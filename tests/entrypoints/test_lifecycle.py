"""An engine frees itself: a dropped LLM is gone at once with the garbage collector off (also as
the first engine of a fresh process, where the compiler stack is first imported), shutdown()
gives the memory back while the LLM is still referenced, and later calls fail clearly."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from tests.utils import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 9, 17, 3], [7, 7, 2, 40, 11]]

# Run in a fresh interpreter, the collector off from before the first import: argv = checkpoint,
# cache dir. An eager engine first (every import an engine needs happens inside it), then a
# compiled one (what only compiling imports); prints what of each is alive after `del llm`.
CHILD = """
import gc, json, sys, weakref
gc.disable()
from compiled_llm import LLM, SamplingParams
ckpt, cache = sys.argv[1:3]
alive = {}
for mode, kw in (("eager", {"enforce_eager": True}), ("backend", {"compile_cache_dir": cache})):
    llm = LLM(ckpt, device="cpu", dtype="float32", **kw)
    llm.generate([[5, 9, 17, 3]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    refs = {"llm": weakref.ref(llm), "engine": weakref.ref(llm.engine),
            "model": weakref.ref(llm.engine.executor.worker.runner.model)}
    del llm
    alive[mode] = [name for name, ref in refs.items() if ref() is not None]
print(json.dumps(alive))
"""


@pytest.fixture(scope="module")
def ckpt() -> str:
    return str(make_checkpoint("llama"))


@pytest.fixture
def gc_off():
    """The collector off for the test: whatever is freed, refcounting freed."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def build(ckpt: str, mode: str, cache_dir: Path | None = None, **kw) -> LLM:
    """An LLM on CPU: mode "eager", or "backend" compiled into cache_dir."""
    if mode == "eager":
        kw["enforce_eager"] = True
    else:
        kw["compile_cache_dir"] = str(cache_dir)
    return LLM(ckpt, device="cpu", dtype="float32", **kw)


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def held(llm: LLM) -> dict[str, weakref.ref]:
    """Weak references to the LLM, its engine, the weights and a compiled piece if any."""
    refs = {"llm": weakref.ref(llm), "engine": weakref.ref(llm.engine),
            "model": weakref.ref(llm.engine.executor.worker.runner.model)}
    backend = getattr(llm.engine.executor.worker.runner.forward_fn, "backend", None)
    if backend is not None:
        refs["compiled piece"] = weakref.ref(next(iter(backend.compiled.values())))
    return refs


def alive(refs: dict[str, weakref.ref]) -> list[str]:
    return [name for name, ref in refs.items() if ref() is not None]


@pytest.mark.parametrize("mode", ["eager", "backend"])
def test_dropped_llm_is_freed_without_gc(ckpt, tmp_path, gc_off, mode):
    # backend: the first build compiles through Dynamo, the second loads the warm snapshot
    for _ in range(1 if mode == "eager" else 2):
        llm = build(ckpt, mode, tmp_path)
        tokens(llm)
        refs = held(llm)
        del llm
        assert alive(refs) == []


def test_first_engines_of_a_process_are_freed_without_gc(ckpt, tmp_path):
    # warm the cache here, so the child's compiled engine loads the snapshot and runs no
    # Dynamo (whose own collection after a compile would hide a cycle left by an import)
    tokens(build(ckpt, "backend", tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, ckpt, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"eager": [], "backend": []}


@pytest.mark.parametrize("mode", ["eager", "backend"])
def test_shutdown_frees_what_the_engine_holds(ckpt, tmp_path, gc_off, mode):
    llm = build(ckpt, mode, tmp_path)
    tokens(llm)
    refs = held(llm)
    del refs["llm"], refs["engine"]
    llm.shutdown()
    assert alive(refs) == []  # the weights and compiled code, with `llm` still held
    runner = llm.engine.executor.worker.runner
    assert runner.kv_caches == [] and runner.input_batch is None and runner.forward_fn is None
    llm.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="engine is shut down"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    with pytest.raises(RuntimeError, match="engine is shut down"):
        llm.engine.step()


def test_shutdown_aborts_running_requests(ckpt, gc_off):
    llm = build(ckpt, "eager")
    eng = llm.engine
    eng.add_request("r", PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    assert eng.num_used_blocks > 0
    llm.shutdown()
    assert not eng.has_unfinished_requests() and eng.num_used_blocks == 0
    refs = {"llm": weakref.ref(llm), "engine": weakref.ref(eng)}
    del llm, eng
    assert alive(refs) == []


def test_with_block_shuts_down(ckpt, gc_off):
    with build(ckpt, "eager") as llm:
        assert len(tokens(llm)[0]) == GREEDY.max_tokens
    assert llm.engine.is_shut_down
    refs = {"llm": weakref.ref(llm), "engine": weakref.ref(llm.engine)}
    del llm
    assert alive(refs) == []


def test_async_llm_shutdown_fails_open_streams(ckpt, gc_off):
    eng = AsyncLLM(EngineArgs(model=ckpt, device="cpu", dtype="float32", enforce_eager=True))
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def main(eng: AsyncLLM):
        stream = await eng.add_request("long", PROMPTS[0], params)
        it = aiter(stream)
        await anext(it)  # running now
        eng.shutdown()
        eng.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="engine is shut down"):
            while True:
                await anext(it)
        with pytest.raises(RuntimeError, match="engine is shut down"):
            await eng.add_request("later", PROMPTS[1], params)

    asyncio.run(main(eng))
    assert not eng._thread.is_alive() and eng.engine.is_shut_down
    refs = {"async llm": weakref.ref(eng), "engine": weakref.ref(eng.engine)}
    del eng
    assert alive(refs) == []
