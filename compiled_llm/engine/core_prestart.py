"""Interpreters started ahead of need: `compiled-llm serve` starts the engine core's first (and,
with several API servers, theirs and the core's arguments), so their imports overlap the front
end's; start_core_process and serve_many take them. One nobody takes is ended at exit (or
reads end-of-file if its front end dies). No torch here: the CLI imports this."""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

API_SERVER = "compiled_llm.entrypoints.server.api_server"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
EARLY_CORE_STOP_WAIT_S = 10.0

# (module, new_session) -> the interpreter started for it, not yet taken
_waiting: dict[tuple[str, bool], subprocess.Popen] = {}
_servers: list[subprocess.Popen] = []  # API-server interpreters, not yet taken
_state: dict[str, object] = {}  # "metrics_dir": made for _servers; "early": an EarlyCore


@dataclass
class EarlyCore:
    """A shared core already sent its arguments (args alone: it derives the rest)."""

    process: subprocess.Popen
    ipc_dir: str  # its front ends' sockets; removed by whoever takes it
    count: int  # how many front ends it serves


def client_addresses(ipc_dir: str, index: int) -> tuple[str, str]:
    """(requests in, outputs out) IPC addresses of front end `index`; it binds them."""
    return f"ipc://{ipc_dir}/in-{index}", f"ipc://{ipc_dir}/out-{index}"


def spawn(module: str, new_session: bool = False, env: dict[str, str] | None = None
          ) -> subprocess.Popen:
    """A fresh interpreter running compiled_llm.engine.<module> (or a dotted module path),
    its stdin a pipe."""
    # a fresh interpreter, not multiprocessing's spawn: that re-runs the caller's main
    # module, which a script without a __main__ guard cannot survive
    name = module if "." in module else f"compiled_llm.engine.{module}"
    return subprocess.Popen([sys.executable, "-m", name], stdin=subprocess.PIPE, env=env,
                            start_new_session=new_session)


def _register() -> None:
    if not (_waiting or _servers or _state):
        atexit.register(discard)


def prestart(module: str, new_session: bool = False) -> None:
    """Start the interpreter of the next core process of this module and session now."""
    key = (module, new_session)
    if key in _waiting:
        return
    _register()
    _waiting[key] = spawn(module, new_session)


def take(module: str, new_session: bool = False) -> subprocess.Popen:
    """The interpreter prestart() started for this module and session if it still runs,
    else a fresh one; any other waiting core interpreter is ended (the guess was wrong)."""
    process = _waiting.pop((module, new_session), None)
    _end_waiting_cores()
    if process is None or process.poll() is not None:
        return spawn(module, new_session)
    return process


def shared_core_fits(args) -> bool:
    """Whether settings read without imports allow several API servers: not an explicit
    pooling runner, nor runtime LoRA updates (each is served by one API server)."""
    runtime_lora = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower()
    return args.runner != "pooling" and not (args.enable_lora and runtime_lora in ("1", "true"))


def start_early_core(args, count: int) -> None:
    """Send the (prestarted) shared core of `count` API servers its arguments now: args, the
    addresses in a directory made here, this pid and sys.path; no spec (it derives that)."""
    _register()
    ipc_dir = tempfile.mkdtemp(prefix="compiled-llm-core-")
    process = take("core_multi", new_session=True)
    _state["early"] = EarlyCore(process, ipc_dir, count)
    addresses = [client_addresses(ipc_dir, i) for i in range(count)]
    with contextlib.suppress(OSError):  # one that died is found by its front ends
        process.stdin.write(pickle.dumps((args, None, None, addresses, os.getpid(), {},
                                          sys.path)))
        process.stdin.close()


def take_early_core(args, count: int) -> EarlyCore:
    """The shared core of `count` API servers: the one start_early_core started if it serves
    that many and still runs, else (that one stopped) one started now. The taker stops it
    and removes its directory."""
    early = _state.pop("early", None)
    # one that exited by itself failed on these args: a second would too (its log says why)
    if early is not None and early.count == count:
        return early
    if early is not None:
        _stop_early(early)
    start_early_core(args, count)
    return _state.pop("early")


def _metrics_env() -> dict[str, str]:
    """The environment of API servers: PROMETHEUS_MULTIPROC_DIR set (a directory made here,
    once, unless the user set one) before they import prometheus_client."""
    if not os.environ.get(METRICS_ENV) and "metrics_dir" not in _state:
        _state["metrics_dir"] = tempfile.mkdtemp(prefix="compiled-llm-metrics-")
    return {**os.environ, METRICS_ENV: os.environ.get(METRICS_ENV) or _state["metrics_dir"]}


def prestart_servers(count: int) -> None:
    """Start `count` API-server interpreters now, each in a session of its own."""
    _register()
    env = _metrics_env()
    _servers.extend(spawn(API_SERVER, True, env) for _ in range(count - len(_servers)))


def take_servers(count: int) -> tuple[list[subprocess.Popen], str | None]:
    """`count` API-server interpreters waiting for their spec on stdin (the prestarted ones
    still running, fresh ones for the rest; extras ended), and the metrics directory they
    were given, now the taker's to remove (None: the user's PROMETHEUS_MULTIPROC_DIR)."""
    env = _metrics_env()
    live = [proc for proc in _servers if proc.poll() is None]
    _servers.clear()
    for proc in live[count:]:
        _kill(proc)
    taken = live[:count]
    taken.extend(spawn(API_SERVER, True, env) for _ in range(count - len(taken)))
    return taken, _state.pop("metrics_dir", None)


def discard() -> None:
    """End the interpreters started ahead that nobody took (they hold nothing yet but their
    imports, or a core's weights being loaded), and remove the directories made for them."""
    _end_waiting_cores()
    discard_servers()


def discard_servers() -> None:
    """End what was started ahead for several API servers (their interpreters, the shared
    core sent its arguments) and nobody took; a waiting core interpreter stays."""
    while _servers:
        _kill(_servers.pop())
    early = _state.pop("early", None)
    if early is not None:
        _stop_early(early)
    metrics_dir = _state.pop("metrics_dir", None)
    if metrics_dir is not None:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _end_waiting_cores() -> None:
    while _waiting:
        _kill(_waiting.popitem()[1])


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        process.stdin.close()
    process.kill()
    process.wait()


def _stop_early(early: EarlyCore) -> None:
    """SIGTERM (it stops building and releases what it loaded), killed if it takes long."""
    try:
        if early.process.poll() is None:
            early.process.send_signal(signal.SIGTERM)
        early.process.wait(EARLY_CORE_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:  # a second Ctrl-C in the wait still ends it and removes its directory
        if early.process.poll() is None:
            early.process.kill()
            early.process.wait()
        shutil.rmtree(early.ipc_dir, ignore_errors=True)
