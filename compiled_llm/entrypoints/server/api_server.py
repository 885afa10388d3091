"""One API-server process of `serve --api-server-count N`: its own AsyncLLM front end
(tokenization, detokenization, stop strings, SSE) attached to the shared engine core, and its
own uvicorn app on a SO_REUSEPORT socket of the common host:port. Run as
`python -m compiled_llm.entrypoints.server.api_server` with an ApiServerSpec pickled on stdin."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from compiled_llm.config import EngineArgs
from compiled_llm.engine.core_multi import CoreEndpoint
from compiled_llm.engine.startup import format_age, process_age_s
from compiled_llm.entrypoints.server.server_config import ServerConfig, listen_host

logger = logging.getLogger(__name__)
PARENT_POLL_S = 1.0  # how often a server checks that its parent still runs


@dataclass
class ApiServerSpec:
    """What an API-server process needs from its parent."""

    args: EngineArgs
    host: str | None
    port: int
    cfg: ServerConfig
    log_level: str
    endpoint: CoreEndpoint
    parent_pid: int
    sys_path: list[str]


def reuse_port_socket(host: str | None, port: int) -> socket.socket:
    """A TCP socket bound to host:port (None: every IPv4 interface) with SO_REUSEPORT: the
    kernel spreads new connections over every listening socket of the group (one per API
    server)."""
    host = listen_host(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def log_prefix() -> str:
    """What starts every log line of this process (vLLM's spelling)."""
    return f"(APIServer pid={os.getpid()}) "


def _uvicorn_log_config(prefix: str) -> dict:
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = prefix + formatter["fmt"]
    return config


def _watch_parent(parent_pid: int) -> None:
    """Stop this server (as SIGTERM does) once its parent is gone: no orphan servers."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _exit(signum, frame) -> None:
    raise SystemExit(0)


def run_api_server(spec: ApiServerSpec) -> None:
    """Serve on the shared port until SIGTERM (or the parent's death)."""
    import uvicorn

    from compiled_llm.core.gc_heap import freeze_startup_heap
    from compiled_llm.entrypoints.async_llm import AsyncLLM
    from compiled_llm.entrypoints.server.app import build_app, uvicorn_config
    from compiled_llm.entrypoints.server.metrics import ServerMetrics

    # uvicorn re-raises the SIGTERM it shut down on: exit through the finally below, so the
    # engine's requests are aborted and its sockets closed (the default action skips that)
    signal.signal(signal.SIGTERM, _exit)
    _watch_parent(spec.parent_pid)
    metrics = ServerMetrics(spec.cfg.model_name, multiprocess=True)
    engine = AsyncLLM(spec.args, observer=metrics, core_endpoint=spec.endpoint)
    try:
        app = build_app(engine, spec.cfg, metrics, shared_dir=spec.endpoint.ipc_dir)
        config = uvicorn_config(app, spec.host, spec.port, spec.cfg, spec.log_level,
                                log_config=_uvicorn_log_config(log_prefix()))
        freeze_startup_heap()
        uvicorn.Server(config).run(sockets=[reuse_port_socket(spec.host, spec.port)])
    finally:
        engine.shutdown()


def _import_server_stack() -> None:
    """What run_api_server imports, before the spec is read: an API server started ahead of
    its spec (core_prestart) imports it while the parent is still starting the core.
    PROMETHEUS_MULTIPROC_DIR is in this process's environment from its start."""
    import uvicorn  # noqa: F401

    import compiled_llm.entrypoints.async_llm  # noqa: F401
    import compiled_llm.entrypoints.server.app  # noqa: F401
    import compiled_llm.entrypoints.server.metrics  # noqa: F401


def main() -> None:
    """The process's entry point: the server stack's imports, the spec from stdin, then
    serve. End-of-file instead of a spec (a parent gone or not needing it): exit quietly."""
    _import_server_stack()
    imported = process_age_s()
    try:
        spec: ApiServerSpec = pickle.load(sys.stdin.buffer)
    except EOFError:
        return
    arrived = process_age_s()
    sys.path[:] = spec.sys_path
    logging.basicConfig(level=spec.log_level.upper(),
                        format=log_prefix() + "%(levelname)s %(name)s: %(message)s")
    # which of the two a warm start's API server waited for: its imports or its spec
    logger.info("interpreter timeline: imports done at %s s, spec at %s s",
                format_age(imported), format_age(arrived))
    run_api_server(spec)


if __name__ == "__main__":
    main()
