"""--enable-prompt-tokens-details (vLLM's): usage.prompt_tokens_details.cached_tokens counts
the prompt tokens served from the prefix cache, in bodies and in a stream's usage chunk; off
(the default), usage has no details."""

from __future__ import annotations

import json

import pytest

from tests.entrypoints.server.inprocess import engine_args, serving

PROMPT = list(range(5, 45))  # 40 tokens: two full blocks of 16 reusable


@pytest.fixture(scope="module")
def srv():
    with serving(engine_args(), enable_prompt_tokens_details=True) as server:
        yield server
        assert server.idle()


def _details(body: dict) -> dict | None:
    return body["usage"].get("prompt_tokens_details")


def test_cached_tokens_in_bodies_and_streams(srv):
    body = {"prompt": PROMPT, "max_tokens": 2}
    first = srv.post("/v1/completions", body).json()
    assert _details(first) == {"cached_tokens": 0}
    again = srv.post("/v1/completions", body).json()
    assert _details(again) == {"cached_tokens": 32}
    stream = srv.post("/v1/completions", {**body, "stream": True,
                                          "stream_options": {"include_usage": True}})
    events = [json.loads(line[6:]) for line in stream.text.splitlines()
              if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    chat = {"messages": [{"role": "user", "content": "The quick brown fox " * 8}],
            "max_tokens": 2}
    srv.post("/v1/chat/completions", chat)
    assert _details(srv.post("/v1/chat/completions", chat).json())["cached_tokens"] >= 16


def test_no_details_by_default():
    with serving(engine_args()) as server:
        body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).json()
        assert "prompt_tokens_details" not in body["usage"]
