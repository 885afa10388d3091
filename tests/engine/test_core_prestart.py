"""Start-up without needless work: the CLI and the core pre-start import nothing heavy, a
front end whose core runs elsewhere not the core's stack, nor a core the front end's; a core
started ahead is the one the engine serves with, one no engine takes is ended."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from compiled_llm import LLM, AsyncLLM, SamplingParams
from compiled_llm.engine import core_prestart
from compiled_llm.engine.core_client import CoreClient
from tests.entrypoints.server.inprocess import engine_args

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "xgrammar", "triton")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _loaded(imports: str, names: tuple[str, ...]) -> list[str]:
    """Which of names (modules) a fresh interpreter holds after `import <imports>`."""
    code = f"import sys, {imports}\nprint(sorted(set({names!r}) & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    return ast.literal_eval(res.stdout)


def test_the_cli_and_the_core_prestart_import_nothing_heavy():
    # `compiled-llm serve` starts the core's interpreter before any of these is imported
    assert _loaded("compiled_llm.entrypoints.cli.main", HEAVY) == []
    assert _loaded("compiled_llm.engine.core_prestart", HEAVY) == []


def test_a_front_end_of_a_process_core_does_not_import_the_core_stack():
    front_end = "compiled_llm.entrypoints.server.app, compiled_llm.engine.core_client"
    core_stack = ("torch._dynamo", "torch._inductor.compile_fx", "compiled_llm.compile",
                  "compiled_llm.engine.core", "compiled_llm.worker.model_runner")
    assert _loaded(front_end, core_stack) == []


def test_a_core_does_not_import_the_front_ends_stack():
    # what a core process imports before its arguments come, then builds (an eager core)
    args = engine_args()
    build = ("compiled_llm.engine.core_proc, compiled_llm.compile, compiled_llm.engine.core\n"
             "from compiled_llm.config import EngineArgs, model_len_bounds\n"
             "from compiled_llm.engine.core_proc import build_core\n"
             "from compiled_llm.worker.loader import load_hf_config\n"
             "from compiled_llm.worker.spec import WorkerSpec\n"
             "import torch\n"
             f"args = EngineArgs(model={args.model!r}, enforce_eager=True, dtype='float32',\n"
             "                  kv_cache_memory_bytes=16 << 20)\n"
             "sched = args.scheduler_config(*model_len_bounds(load_hf_config(args.model)))\n"
             "spec = WorkerSpec(args.model, torch.float32, torch.device('cpu'), sched)\n"
             "build_core(args, spec, (0,)).shutdown()")
    front_end = ("transformers", "fastapi", "uvicorn", "starlette", "prometheus_client",
                 "xgrammar", "openai")
    assert _loaded(build, front_end) == []


def test_the_engine_takes_the_prestarted_core_and_serves_with_it():
    with LLM(**vars(engine_args())) as llm:
        expected = llm.generate(["Hello there"], GREEDY, use_tqdm=False)[0].outputs[0]
    core_prestart.prestart("core_proc")
    [waiting] = core_prestart._waiting.values()
    engine = AsyncLLM(engine_args())
    try:
        core = engine.engine.core
        assert isinstance(core, CoreClient) and core.process is waiting
        assert core_prestart._waiting == {}
        got = engine.engine.tokenize("Hello there")  # the front end works as before
        assert got[1]

        async def run():
            final = None
            async for out in engine.generate("Hello there", GREEDY, "a"):
                final = out
            return final.outputs[0]

        assert asyncio.run(run()).token_ids == expected.token_ids
    finally:
        engine.shutdown()
    assert core.process.returncode == 0


def test_a_wrongly_guessed_or_untaken_core_is_ended():
    core_prestart.prestart("core_multi", new_session=True)
    [guessed] = core_prestart._waiting.values()
    taken = core_prestart.take("core_proc")  # not the guess: a fresh one, the guess ended
    try:
        assert taken is not guessed and guessed.returncode is not None
        assert core_prestart._waiting == {}
        core_prestart.prestart("core_proc")
        [untaken] = core_prestart._waiting.values()
        core_prestart.discard()
        assert untaken.returncode is not None and core_prestart._waiting == {}
    finally:
        taken.kill()
        taken.wait()


def test_a_prestarted_core_whose_front_end_is_gone_exits_quietly():
    process = subprocess.Popen([sys.executable, "-m", "compiled_llm.engine.core_proc"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    process.stdin.close()  # what its end of the pipe reads once the front end has died
    assert process.wait(120) == 0
    assert b"Traceback" not in process.stderr.read()


def test_prestarted_api_servers_are_taken_and_a_wrong_count_is_made_up():
    core_prestart.prestart_servers(3)
    prestarted = list(core_prestart._servers)
    metrics_dir = core_prestart._state["metrics_dir"]
    taken, owned = core_prestart.take_servers(2)  # fewer than guessed: the extra one ends
    try:
        assert taken == prestarted[:2] and prestarted[2].returncode is not None
        assert owned == metrics_dir and os.path.isdir(metrics_dir)
        assert all(proc.poll() is None for proc in taken)
        assert all(os.getsid(proc.pid) == proc.pid for proc in taken)  # sessions of their own
        core_prestart.prestart_servers(1)
        [waiting] = core_prestart._servers
        more, again = core_prestart.take_servers(2)  # more than guessed: a fresh one added
        assert more[0] is waiting and more[1] not in prestarted and again is not None
        taken += more
        os.rmdir(again)
    finally:
        for proc in taken:
            proc.kill()
            proc.wait()
        os.rmdir(metrics_dir)


def test_what_a_wrong_guess_started_for_several_servers_is_ended_with_its_dirs():
    args = engine_args()
    core_prestart.start_early_core(args, 4)  # guessed 4; serving settles on 1
    core_prestart.prestart_servers(4)
    early, servers = core_prestart._state["early"], list(core_prestart._servers)
    dirs = [early.ipc_dir, core_prestart._state["metrics_dir"]]
    core_prestart.prestart("core_proc")
    core_prestart.discard_servers()
    assert early.process.returncode is not None
    assert all(proc.returncode is not None for proc in servers)
    assert not any(map(os.path.exists, dirs))
    assert list(core_prestart._waiting) == [("core_proc", False)]  # the one-server core stays
    core_prestart.discard()
    assert core_prestart._waiting == {} and core_prestart._state == {}


def test_an_early_core_of_another_count_is_stopped_and_replaced():
    args = engine_args()
    core_prestart.start_early_core(args, 3)
    guessed = core_prestart._state["early"]
    early = core_prestart.take_early_core(args, 2)
    try:
        assert guessed.process.returncode is not None and not os.path.exists(guessed.ipc_dir)
        assert early.count == 2 and early.process.poll() is None and core_prestart._state == {}
    finally:
        core_prestart._stop_early(early)
    assert not os.path.exists(early.ipc_dir)
