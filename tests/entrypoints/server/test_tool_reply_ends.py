"""Chat replies with tools on an in-process server, as vLLM shapes them: the EOS that ends a
reply leaves no text for a parser that keeps special tokens (llama3_json), a forced (named or
required) call's message has content "", a stream cut off by max_tokens ends "length", and a
parser that holds text back sends no empty-delta chunks."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.entrypoints.server.inprocess import MODEL, engine_args, serving
from tests.entrypoints.server.tool_model import tool_checkpoint

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "search", "parameters": {
             "type": "object", "properties": {"q": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "weather?"}]
LLAMA3_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'



@pytest.fixture(scope="module")
def srv():
    args = engine_args(model=str(tool_checkpoint()))
    with serving(args, enable_auto_tool_choice=True, tool_call_parser="llama3_json") as server:
        yield server


def _body(**kw) -> dict:
    return {"messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 60, **kw}


def _stream(srv, body: dict) -> list[dict]:
    """The stream's choice events, in order."""
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=120, headers=srv.headers,
                      json={"model": MODEL, **body, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return [choice for event in events for choice in event["choices"]]


def _calls(choices: list[dict]) -> list[tuple[str, str]]:
    calls: list[list[str]] = []
    for choice in choices:
        for d in choice["delta"].get("tool_calls") or []:
            if d["index"] == len(calls):
                calls.append([d["function"]["name"], ""])
            calls[d["index"]][1] += d["function"]["arguments"]
    return [tuple(call) for call in calls]


def test_llama3_json_calls_parse_whole_and_streamed(srv):
    """The parser keeps special tokens; the EOS after the call must not reach it."""
    body = _body(structured_outputs={"regex": re.escape(LLAMA3_CALL)})
    choice = srv.post("/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == \
        ("get_weather", '{"city": "Paris"}')
    choices = _stream(srv, body)
    assert _calls(choices) == [("get_weather", '{"city": "Paris"}')]
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert all(c["delta"] for c in choices[:-1])  # no empty-delta chunks along the way


def test_forced_calls_have_empty_string_content(srv):
    """A function without parameters: the grammar leaves the model nothing to ramble in."""
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]
    named = {"type": "function", "function": {"name": "ping"}}
    for tool_choice in (named, "required"):
        body = _body(tools=tools, tool_choice=tool_choice, parallel_tool_calls=False)
        message = srv.post("/v1/chat/completions", body).json()["choices"][0]["message"]
        assert message["content"] == "", tool_choice
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["ping"]


def test_required_cut_off_ends_length_in_both(srv):
    body = _body(tool_choice="required", max_tokens=12)
    choice = srv.post("/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    choices = _stream(srv, body)
    assert choices[-1]["finish_reason"] == "length"
    assert all(arguments for _, arguments in _calls(choices))
    assert all(c["delta"] for c in choices[:-1])


def test_plain_stream_sends_content_even_when_empty(srv):
    """Without a parser every delta carries its text, "" too (the EOS that ends it)."""
    eos = srv.engine.tokenizer.eos_token_id
    choices = _stream(srv, {"messages": MESSAGES, "max_tokens": 4,
                            "logit_bias": {str(eos): 100}})
    assert choices[-1] == {**choices[-1], "delta": {"content": ""}, "finish_reason": "stop"}
