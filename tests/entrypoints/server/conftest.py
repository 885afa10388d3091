"""A live `compiled-llm serve` on a tiny checkpoint, shared by the server tests, and helpers
to read its Prometheus metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.utils import make_checkpoint

ROOT = Path(__file__).resolve().parents[3]  # the repository root
API_KEY = "sk-test"
MAX_BODY = 200_000


@dataclass
class Server:
    url: str  # http://host:port
    model: str
    log: Path

    def metrics(self) -> dict[str, float]:
        """Sample name (+ outcome label if any) -> value, summed over other labels."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = s.name + (f"[{s.labels['outcome']}]" if "outcome" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Metrics once nothing runs or waits and no KV block is in use (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["compiled_llm:num_requests_running"] == 0
                    and m["compiled_llm:num_requests_waiting"] == 0
                    and m["compiled_llm:kv_cache_used_blocks"] == 0)
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, *extra: str) -> tuple[subprocess.Popen, Server]:
    port = _free_port()
    log = Path(tempfile.mkstemp(prefix="cllm-serve-", suffix=".log")[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "compiled_llm.entrypoints.cli", "serve",
           "--model", str(model_dir),
           "--port", str(port), "--enforce-eager", "--dtype", "float32", "--log-level",
           "warning", "--kv-cache-memory-bytes", str(16 << 20), *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", str(model_dir), log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return proc, server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server did not come up:\n{log.read_text()}")


@pytest.fixture(scope="session")
def server():
    proc, srv = start_server(make_checkpoint("llama"), "--api-key", API_KEY,
                             "--max-body-bytes", str(MAX_BODY))
    yield srv
    stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server start_server started (SIGTERM, then SIGKILL after 20 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def async_client(server: Server):
    """An AsyncOpenAI client; make one per event loop (its connections belong to the loop)."""
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                              timeout=120)
