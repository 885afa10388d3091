"""Disconnects and load against a live server: a client that goes away aborts its request and
frees its KV blocks; 200 concurrent mixed streams all finish and leave the pool empty."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import httpx

from tests.entrypoints.server.conftest import API_KEY, async_client
from tests.utils import CORPUS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ABORTS = "compiled_llm:request_success_total[abort]"


def _wait_aborts(server, before: float) -> dict:
    deadline = time.monotonic() + 30
    while True:
        m = server.wait_idle()
        if m[ABORTS] > before or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_stream_disconnect_aborts_and_frees_blocks(server):
    before = server.metrics()
    body = {"model": server.model, "messages": [{"role": "user", "content": "The quick"}],
            "max_tokens": 480, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH,
                      timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert all(ln.startswith("data: ") or not ln for ln in got)
        assert server.metrics()["compiled_llm:kv_cache_used_blocks"] > 0
    # the connection is closed here, mid-stream
    after = _wait_aborts(server, before[ABORTS])
    assert after[ABORTS] == before[ABORTS] + 1
    assert after["compiled_llm:kv_cache_used_blocks"] == 0
    generated = after["compiled_llm:generation_tokens_total"] - \
        before["compiled_llm:generation_tokens_total"]
    assert generated < 480


def test_non_stream_disconnect_aborts(server):
    before = server.metrics()
    body = json.dumps({"model": server.model, "prompt": "The quick", "max_tokens": 480, "n": 4,
                       "ignore_eos": True}).encode()
    url = httpx.URL(server.url)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: {AUTH['Authorization']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head + body)
        # the client leaves once the request runs (not before its admission: nothing to abort)
        deadline = time.monotonic() + 30
        while server.metrics()["compiled_llm:kv_cache_used_blocks"] == 0:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.02)
    after = _wait_aborts(server, before[ABORTS])
    assert after[ABORTS] == before[ABORTS] + 1
    assert after["compiled_llm:kv_cache_used_blocks"] == 0


def _prompt(rng: random.Random) -> str:
    words = CORPUS.split()
    start = rng.randrange(len(words) - 200)
    return " ".join(words[start:start + rng.choice([2, 8, 30, 120])])


async def _one(client, server, rng: random.Random, i: int) -> tuple[int, str, int]:
    max_tokens = rng.randint(1, 24)
    extra = {"stream_options": {"include_usage": True}, "max_tokens": max_tokens,
             "temperature": rng.choice([0.0, 0.8, 1.0]), "model": server.model, "stream": True}
    store: list = []
    if i % 2:
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": _prompt(rng)}], **extra)
        pieces = [c.choices[0].delta.content or "" async for c in _keep(stream, store)]
    else:
        stream = await client.completions.create(prompt=_prompt(rng), **extra)
        pieces = [c.choices[0].text async for c in _keep(stream, store)]
    usage, reasons = store[-1].usage, [c.choices[0].finish_reason for c in store if c.choices]
    assert reasons[-1] in ("stop", "length") and not any(reasons[:-1])
    assert 1 <= usage.completion_tokens <= max_tokens
    assert reasons[-1] == "stop" or usage.completion_tokens == max_tokens
    return max_tokens, "".join(pieces), usage.completion_tokens


async def _keep(stream, store: list):
    async for chunk in stream:
        store.append(chunk)
        if chunk.choices:
            yield chunk


def test_200_concurrent_streams(server):
    rng = random.Random(0)

    async def main():
        client = async_client(server)
        async with client:
            return await asyncio.gather(*[_one(client, server, rng, i) for i in range(200)])

    before = server.metrics()
    results = asyncio.run(main())
    assert len(results) == 200
    after = server.wait_idle()
    assert after["compiled_llm:kv_cache_used_blocks"] == 0
    assert after["compiled_llm:num_requests_running"] == 0
    done = sum(after[f"compiled_llm:request_success_total[{k}]"] -
               before.get(f"compiled_llm:request_success_total[{k}]", 0)
               for k in ("stop", "length"))
    assert done == 200
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["compiled_llm:generation_tokens_total"] == sum(r[2] for r in results)
    assert delta["compiled_llm:prompt_tokens_total"] > 200
    assert delta["compiled_llm:time_to_first_token_seconds_count"] == 200
    assert delta["compiled_llm:e2e_request_latency_seconds_count"] == 200
    assert delta["compiled_llm:inter_token_latency_seconds_count"] > 0
