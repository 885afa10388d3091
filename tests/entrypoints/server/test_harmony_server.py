"""`--tool-call-parser openai` on a live in-process server: a harmony reply (forced by a regex,
as a tiny random model writes none) gives its final channel as content and its message to
functions.NAME as a tool call, whole and streamed, with finish_reason "tool_calls"; the
analysis channel never reaches the content."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.entrypoints.server.inprocess import MODEL, engine_args, serving
from tests.entrypoints.server.tool_model import tool_checkpoint

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
REPLY = ("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>"
         "commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
         'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')


@pytest.fixture(scope="module")
def srv():
    args = engine_args(model=str(tool_checkpoint()))
    with serving(args, enable_auto_tool_choice=True, tool_call_parser="openai") as server:
        yield server


def _body(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS,
            "temperature": 0, "max_tokens": 400,
            "structured_outputs": {"regex": re.escape(REPLY)}, **kw}


def test_call_and_preamble_whole(srv):
    choice = srv.post("/v1/chat/completions", _body()).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == \
        ("get_weather", '{"city": "Paris"}')


def test_call_and_preamble_streamed(srv):
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=120,
                      headers=srv.headers, json={"model": MODEL, **_body(), "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [choice["delta"] for event in events for choice in event["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Paris"}'
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
