"""The real app over a real AsyncLLM, served by uvicorn on a thread of the test process: for
tests that need a server configured their own way, or the engine object at hand."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.server.app import build_app, uvicorn_config
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.server_config import ServerConfig
from tests.entrypoints.server.conftest import _free_port
from tests.utils import make_checkpoint

MODEL = "test-model"


@dataclass
class InProcessServer:
    url: str
    engine: AsyncLLM
    server: uvicorn.Server
    thread: threading.Thread
    headers: dict

    def post(self, path: str, body: dict, timeout: float = 60.0, **kw) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json={"model": MODEL, **body},
                          headers=self.headers, timeout=timeout, **kw)

    def idle(self, timeout: float = 60.0) -> bool:
        """Whether the engine finishes every request (and frees every block) in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = asyncio.run(self.engine.call(self.engine.engine.has_unfinished_requests))
            if not busy and self.engine.engine.num_used_blocks == 0:
                return True
            time.sleep(0.05)
        return False

    def block_engine(self) -> threading.Event:
        """Hold the engine thread in a command until the returned event is set (a stuck
        engine, through the public call API); returns once the engine thread is held."""
        release, held = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait()

        threading.Thread(target=lambda: asyncio.run(self.engine.call(hold)),
                         daemon=True).start()
        assert held.wait(30), "the engine thread did not take the blocking command"
        return release


def engine_args(**kw) -> EngineArgs:
    """The tiny test model, eager and small-cached, with kw overriding."""
    return EngineArgs(**{"model": str(make_checkpoint("llama")), "enforce_eager": True,
                         "dtype": "float32", "kv_cache_memory_bytes": 16 << 20, **kw})


@contextmanager
def serving(args: EngineArgs | None = None, **cfg) -> Iterator[InProcessServer]:
    """A server of the test model on a free port; cfg are ServerConfig fields."""
    config = ServerConfig(model_name=MODEL, **cfg)
    metrics = ServerMetrics(MODEL)
    engine = AsyncLLM(args or engine_args(), observer=metrics)
    port = _free_port()
    server = uvicorn.Server(uvicorn_config(build_app(engine, config, metrics), "127.0.0.1",
                                           port, config, "warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.02)
    headers = {"Authorization": f"Bearer {config.api_key[0]}"} if config.api_key else {}
    try:
        yield InProcessServer(f"http://127.0.0.1:{port}", engine, server, thread, headers)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.shutdown()


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of a 200 SSE response's data lines ([DONE] left out)."""
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: {")]
