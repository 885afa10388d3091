"""`compiled-llm serve --api-server-count 2` as a real process tree on the demo model: concurrent
streams through the official openai client get the one-server path's greedy outputs, requests
land on both API servers, any server's /metrics shows the totals, a killed API server leaves
the other serving with the core's pool empty, a dead core makes every server unhealthy, and
SIGTERM to the parent leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from compiled_llm.engine.llm_engine import DEMO_MODEL
from compiled_llm.entrypoints.cli.main import main
from tests.entrypoints.server.conftest import ROOT, Server, start_server
from tests.entrypoints.server.inprocess import MODEL, engine_args, serving

PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "Hello",
           "It was the best of times", "Call me", "All happy families", "The sky above"]
MAX_TOKENS = 16
ACCESS = re.compile(r'\(APIServer pid=(\d+)\) INFO: .*"(\w+) (\S+) HTTP')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below pid."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parents[int(entry)] = int(stat.read().rsplit(") ", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                with open(f"/proc/{child}/cmdline", "rb") as cmd:
                    found[child] = cmd.read().replace(b"\0", b" ").decode()
                frontier.append(child)
    return found


def _roles(proc: subprocess.Popen) -> tuple[list[int], int]:
    """(API-server pids, engine-core pid) of a `serve --api-server-count` parent."""
    kids = _descendants(proc.pid)
    servers = sorted(pid for pid, cmd in kids.items() if "server.api_server" in cmd)
    [core] = [pid for pid, cmd in kids.items() if "engine.core_multi" in cmd]
    return servers, core


def _access(server: Server, path: str) -> set[int]:
    """The API-server pids whose access log shows a request for path."""
    return {int(pid) for pid, _, seen in ACCESS.findall(server.log.read_text())
            if seen == path}


def _wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


async def _streams(server: Server, model: str) -> list[tuple[str, str]]:
    """(text, finish_reason) of each prompt, every prompt streamed at once, twice over
    (completions, then chat), each stream on a connection of its own."""
    import openai

    async def one(prompt: str, chat: bool) -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none",
                                      max_retries=0, timeout=120) as client:
            common = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                      "stream": True}
            if chat:
                stream = await client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt}], **common)
            else:
                stream = await client.completions.create(prompt=prompt, **common)
            text, reason = "", None
            async for chunk in stream:
                for choice in chunk.choices:
                    text += (choice.delta.content or "") if chat else choice.text
                    reason = choice.finish_reason or reason
            return text, reason

    return await asyncio.gather(*[one(p, chat) for chat in (False, True) for p in PROMPTS])


@pytest.fixture(scope="module")
def expected() -> list[tuple[str, str]]:
    """The one-server path's streams of the same requests."""
    with serving(engine_args(model=str(DEMO_MODEL))) as srv:
        return asyncio.run(_streams(Server(srv.url, MODEL, None), MODEL))


@pytest.fixture(scope="module")
def served(expected):
    proc, server = start_server(DEMO_MODEL, "--api-server-count", "2", "--log-level", "info")
    try:  # /health answered once the first server was up: wait for the second
        _wait_for(lambda: server.log.read_text().count("Application startup complete") == 2,
                  120, "both API servers")
        yield proc, server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_concurrent_streams_match_the_one_server_path_on_both_servers(served, expected):
    proc, server = served
    got = asyncio.run(_streams(server, server.model))
    assert got == expected
    assert all(text for text, _ in got) and {reason for _, reason in got} <= {"length", "stop"}
    assert [reason for _, reason in got].count("length") >= len(PROMPTS)
    servers, _ = _roles(proc)
    assert len(servers) == 2
    assert _access(server, "/v1/completions") | _access(server, "/v1/chat/completions") == \
        set(servers), "every stream landed on one API server"


def _started(pid: int) -> float:
    """When process pid started, in seconds since boot."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(") ", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def test_the_servers_started_ahead_with_the_core_are_the_ones_serving(served):
    proc, server = served
    servers, core = _roles(proc)
    logged = re.search(r"with 2 API servers \(pids \[(\d+), (\d+)\]\), engine core pid (\d+)",
                       server.log.read_text())
    assert logged and sorted(map(int, logged.groups()[:2])) == servers
    assert int(logged[3]) == core
    # started together at the very start (before the parent's imports), not after them
    assert all(abs(_started(pid) - _started(core)) < 2.0 for pid in servers)
    assert set(servers) == _access(server, "/v1/completions") | \
        _access(server, "/v1/chat/completions")


def test_any_server_metrics_show_the_totals_and_the_core_gauges(served):
    proc, server = served
    servers, _ = _roles(proc)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while seen != set(servers):  # fresh connections, until both servers answered a scrape
        assert time.monotonic() < deadline, f"only {seen} of {servers} answered a scrape"
        metrics = server.wait_idle()
        finished = (metrics["compiled_llm:request_success_total[length]"]
                    + metrics["compiled_llm:request_success_total[stop]"])
        assert finished == 2 * len(PROMPTS)  # the earlier test's, over both servers
        assert metrics["compiled_llm:e2e_request_latency_seconds_count"] == finished
        assert metrics["vllm:e2e_request_latency_seconds_count"] == finished  # vLLM's name
        assert metrics["compiled_llm:kv_cache_used_blocks"] == 0  # read from the core
        assert metrics["compiled_llm:num_requests_running"] == 0
        seen = _access(server, "/metrics")
        assert seen <= set(servers)


def test_stored_responses_chain_whichever_server_answers(served):
    """previous_response_id, GET and DELETE find a response kept by the other API server
    (each call on a connection of its own, so the kernel spreads them over both). After the
    metrics test, which counts the requests the servers answered before it."""
    import openai

    proc, server = served

    def call(method: str, *args, **kwargs):
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                           timeout=120) as client:
            return getattr(client.responses, method)(*args, **kwargs)

    common = {"model": server.model, "max_output_tokens": 4, "temperature": 0.0}
    previous = call("create", input="Hello", **common).id
    for _ in range(6):
        previous = call("create", input="Go on", previous_response_id=previous, **common).id
        assert call("retrieve", previous).id == previous
    call("delete", previous)
    for _ in range(4):
        with pytest.raises(openai.NotFoundError):
            call("retrieve", previous)


def test_a_killed_api_server_leaves_the_other_serving_and_frees_its_blocks(served):
    proc, server = served
    servers, core = _roles(proc)
    long = {"model": server.model, "prompt": "Once upon a time", "max_tokens": 60,
            "temperature": 0.0, "ignore_eos": True, "stream": True}

    async def stream_until_cut() -> int:
        async with httpx.AsyncClient(timeout=120) as client:  # a connection of its own
            count = 0
            try:
                async with client.stream("POST", f"{server.url}/v1/completions",
                                         json=long) as reply:
                    async for _ in reply.aiter_lines():
                        count += 1
                        if count == 4:
                            ready.set()
            except httpx.HTTPError:
                return -1
            return count

    async def run() -> list[int]:
        tasks = [asyncio.create_task(stream_until_cut()) for _ in range(12)]
        await asyncio.wait_for(ready.wait(), 60)
        os.kill(servers[0], signal.SIGKILL)
        return await asyncio.gather(*tasks)

    ready = asyncio.Event()
    results = asyncio.run(run())
    # the streams on the killed server were cut, those on the other one ran to the end
    assert -1 in results and max(results) > MAX_TOKENS, results
    _wait_for(lambda: not _alive(servers[0]), 10, "the killed server to go")
    for _ in range(6):  # the kernel sends every new connection to the one left
        reply = httpx.post(f"{server.url}/v1/completions", timeout=60,
                           json={"model": server.model, "prompt": "Hello", "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    metrics = server.wait_idle()
    assert metrics["compiled_llm:kv_cache_used_blocks"] == 0
    assert metrics["compiled_llm:num_requests_running"] == 0
    assert re.search(r"front end \d is gone; aborted its [1-9]\d* requests",
                     server.log.read_text())
    assert proc.poll() is None and _alive(core)


def test_sigterm_to_the_parent_stops_every_process(served):
    proc, server = served
    kids = _descendants(proc.pid)
    assert any("engine.core_multi" in cmd for cmd in kids.values())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    _wait_for(lambda: not any(map(_alive, kids)), 10, "every child to exit")
    assert "engine core: stopping (SIGTERM)" in server.log.read_text()


@pytest.mark.slow
def test_a_dead_core_makes_every_api_server_unhealthy():
    proc, server = start_server(DEMO_MODEL, "--api-server-count", "2")
    try:
        servers, core = _roles(proc)
        os.kill(core, signal.SIGKILL)
        for _ in range(8):  # fresh connections: both servers answer in time
            _wait_for(lambda: httpx.get(f"{server.url}/health", timeout=10).status_code == 503,
                      10, "an unhealthy server")
        reply = httpx.post(f"{server.url}/v1/completions", timeout=30,
                           json={"model": server.model, "prompt": "Hello", "max_tokens": 4})
        assert reply.status_code == 503
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _wait_for(lambda: not any(map(_alive, servers)), 10, "every server to exit")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_bad_model_path_exits_non_zero_with_the_error(tmp_path):
    missing = tmp_path / "no-such-model"
    res = subprocess.run([sys.executable, "-m", "compiled_llm.entrypoints.cli", "serve",
                          "--model", str(missing), "--port", "0", "--api-server-count", "2"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode != 0
    assert str(missing) in res.stdout + res.stderr


def test_settings_the_core_would_refuse_are_a_clear_error_of_serve():
    """The early core gets args alone; serve checks what it derives from them too, so a length
    past the model's maximum is one error line and exit status 2, not core tracebacks."""
    res = subprocess.run([sys.executable, "-m", "compiled_llm.entrypoints.cli", "serve",
                          "--model", str(DEMO_MODEL), "--port", "0", "--api-server-count", "2",
                          "--max-model-len", "100000000"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2
    assert "exceeds the model's maximum length" in res.stderr


@pytest.mark.parametrize("argv, message", [
    (["--api-server-count", "0"], "api_server_count must be >= 1"),
    (["--api-server-count", "2", "--no-engine-core-process"], "engine_core_process"),
])
def test_bad_api_server_counts_are_refused(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err
