"""`serve --api-server-count N` (N > 1): N API-server processes, all on one host:port, in front
of one engine core process. This parent only supervises: it holds the port, starts the core
and the servers (each in a session of its own, so a terminal's Ctrl-C reaches only the
parent), and on SIGTERM or Ctrl-C stops every one of them. A server that dies leaves the
others serving; the parent exits once none is left."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from compiled_llm.config import EngineArgs
from compiled_llm.engine import core_prestart
from compiled_llm.entrypoints.server.api_server import ApiServerSpec, reuse_port_socket
from compiled_llm.entrypoints.server.server_config import ServerConfig, listen_host

logger = logging.getLogger(__name__)
SUPERVISE_POLL_S = 0.2
CORE_STOP_WAIT_S = 10.0
SERVER_STOP_MARGIN_S = 5.0  # past a server's graceful shutdown, before it is killed


@dataclass
class _Children:
    """The processes the parent started, and the directories it made for them."""

    ipc_dir: str
    metrics_dir: str | None  # ours to remove (None: the user's PROMETHEUS_MULTIPROC_DIR)
    core: subprocess.Popen | None = None
    servers: list[subprocess.Popen] = field(default_factory=list)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to every server (grace_s to finish their requests), then to the core;
        killed when they take longer. Removes the directories."""
        for proc in self.servers:
            _signal(proc, signal.SIGTERM)
        for proc in self.servers:
            _stop_wait(proc, grace_s + SERVER_STOP_MARGIN_S)
        if self.core is not None:
            _signal(self.core, signal.SIGTERM)
            _stop_wait(self.core, CORE_STOP_WAIT_S)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        if self.metrics_dir is not None:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


def _signal(proc: subprocess.Popen, signum: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)


def _stop_wait(proc: subprocess.Popen, seconds: float) -> None:
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        logger.warning("process %d did not stop within %.0f s; killing it", proc.pid, seconds)
        proc.kill()
        proc.wait()


def serve_many(args: EngineArgs, host: str | None, port: int, cfg: ServerConfig, log_level: str,
               count: int) -> int:
    """Serve with `count` API servers until SIGTERM or Ctrl-C (0), or until every server
    is gone (1). The core and the servers are those core_prestart started ahead where they
    fit (the core already loading from args alone), else started now."""
    from compiled_llm.engine.core_multi import CoreEndpoint
    from compiled_llm.engine.core_spec import core_spec

    if args.engine_core_process is False:
        raise ValueError("api_server_count > 1 needs the engine core in its own process "
                         "(engine_core_process must not be false)")
    held = reuse_port_socket(host, port)  # the port is ours (not listening: no connections)
    port = held.getsockname()[1]
    stop = _stop_on_signals()
    # the settings the core derives its spec from, checked here too: a bad dtype or length
    # is a clear error of this process (the early core, failing alike, is stopped by discard)
    core_spec(args, None)
    early = core_prestart.take_early_core(args, count)
    children = _Children(early.ipc_dir, None, early.process)
    try:
        children.servers, children.metrics_dir = core_prestart.take_servers(count)
        for index, proc in enumerate(children.servers):
            endpoint = CoreEndpoint(children.ipc_dir, index, children.core.pid)
            _hand_spec(proc, ApiServerSpec(args, host, port, cfg, log_level, endpoint,
                                           os.getpid(), sys.path))
        logger.info("serving on %s:%d with %d API servers (pids %s), engine core pid %d",
                    listen_host(host), port, count, [p.pid for p in children.servers],
                    children.core.pid)
        return _supervise(children, stop)
    finally:
        children.stop(cfg.timeout_graceful_shutdown)
        held.close()


def _hand_spec(proc: subprocess.Popen, spec: ApiServerSpec) -> None:
    """Write its spec to an API server waiting for it on stdin (one that died already is
    found by the supervision)."""
    with contextlib.suppress(OSError):
        proc.stdin.write(pickle.dumps(spec))
        proc.stdin.close()


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set (instead of ending the parent at once)."""
    stop = threading.Event()

    def handler(signum, frame) -> None:
        logger.info("stopping the API servers and the engine core (%s)",
                    signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _supervise(children: _Children, stop: threading.Event) -> int:
    """Watch the children until stop is set (0) or no server is left (1)."""
    live = dict(enumerate(children.servers))
    core_dead = False
    while not stop.wait(SUPERVISE_POLL_S):
        for index, proc in list(live.items()):
            if proc.poll() is not None:
                del live[index]
                logger.warning("API server %d (pid %d) exited with code %s; %d still serving",
                               index, proc.pid, proc.returncode, len(live))
        if not live:
            logger.error("no API server is left; stopping")
            return 1
        if not core_dead and children.core.poll() is not None:
            core_dead = True
            logger.error("the engine core (pid %d) exited with code %s; the API servers "
                         "report unhealthy", children.core.pid, children.core.returncode)
    return 0
