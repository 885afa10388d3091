"""Reasoning through a live server (--reasoning-parser qwen3): the thinking span goes to
reasoning_content, streamed before the content; the thinking budget ends it with </think>;
structured outputs and tool grammars apply only after it; enable_thinking=False thinks not, nor
does reasoning_effort "none" (vLLM's: other efforts turn thinking on)."""

# ruff: noqa: F811  (the session fixtures are imported by name)
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.entrypoints.server.tool_model import tool_client, tool_server  # noqa: F401

SCHEMA = {"type": "object", "required": ["n"], "properties": {
    "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
MESSAGES = [{"role": "user", "content": "Pick a digit."}]
THINK = {"chat_template_kwargs": {"enable_thinking": True}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "digit", "schema": SCHEMA}}


def _ask(client, server, budget, **kwargs):
    return client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=60, temperature=1.0,
        response_format=FORMAT, extra_body={**THINK, "thinking_token_budget": budget},
        **kwargs)


@pytest.mark.parametrize("budget", [0, 3, 8])
def test_budget_ends_thinking_then_the_schema_holds(tool_client, tool_server, budget):
    r = _ask(tool_client, tool_server, budget, n=4, seed=budget, logprobs=True)
    for choice in r.choices:
        tokens = [entry.token for entry in choice.logprobs.content]
        assert "</think>" in tokens[:budget + 1]
        # per-token texts split multi-byte characters, so compare the ends only
        assert choice.message.reasoning_content is not None
        assert "</think>" not in choice.message.reasoning_content + choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"


def test_streamed_reasoning_comes_first_and_matches(tool_client, tool_server):
    whole = _ask(tool_client, tool_server, 5, seed=7).choices[0].message
    kinds, reasoning, content = [], "", ""
    for chunk in _ask(tool_client, tool_server, 5, seed=7, stream=True):
        delta = chunk.choices[0].delta.model_dump()
        if delta.get("reasoning_content"):
            kinds.append("reasoning")
            reasoning += delta["reasoning_content"]
        if delta.get("content"):
            kinds.append("content")
            content += delta["content"]
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and "content" in kinds
    assert (reasoning, content) == (whole.reasoning_content, whole.content)


def test_thinking_off_means_no_reasoning(tool_client, tool_server):
    r = tool_client.chat.completions.create(
        model=tool_server.model, messages=MESSAGES, max_tokens=60, temperature=1.0, seed=1,
        response_format=FORMAT, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(message.content), SCHEMA)


def test_reasoning_alone_leaves_content_null(tool_client, tool_server):
    # a reply still thinking when max_tokens cuts it has no content: null, as vLLM's, not ""
    r = tool_client.chat.completions.create(
        model=tool_server.model, messages=MESSAGES, max_tokens=3, seed=0, extra_body=THINK)
    message = r.choices[0].message
    assert message.reasoning_content and message.content is None


def test_required_tool_call_after_thinking(tool_client, tool_server):
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}]
    r = tool_client.chat.completions.create(
        model=tool_server.model, messages=MESSAGES, max_tokens=80, temperature=1.0, seed=2,
        tools=tools, tool_choice="required", parallel_tool_calls=False,
        extra_body={**THINK, "max_thinking_tokens": 4})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning_content
    jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), SCHEMA)


def test_budget_needs_a_reasoning_parser(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4,
                                       extra_body={"thinking_token_budget": 4})
    assert info.value.body["param"] == "thinking_token_budget"


def test_negative_budget_is_a_400(tool_client, tool_server):
    with pytest.raises(openai.BadRequestError) as info:
        _ask(tool_client, tool_server, -1)
    assert info.value.body["param"] == "thinking_token_budget"
    assert tool_server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_drops_it(tool_client, tool_server, stream):
    """vLLM's include_reasoning=false: no reasoning in the message or any delta; the
    content is the same as with it."""
    kwargs = dict(model=tool_server.model, messages=MESSAGES, max_tokens=40, temperature=1.0,
                  seed=3, response_format=FORMAT)
    shown = tool_client.chat.completions.create(
        **kwargs, extra_body={**THINK, "thinking_token_budget": 4}).choices[0].message
    assert shown.reasoning_content
    hidden = {**THINK, "thinking_token_budget": 4, "include_reasoning": False}
    if stream:
        deltas = [chunk.choices[0].delta.model_dump() for chunk in
                  tool_client.chat.completions.create(**kwargs, stream=True, extra_body=hidden)
                  if chunk.choices]
        assert not any(d.get("reasoning_content") or d.get("reasoning") for d in deltas)
        content = "".join(d.get("content") or "" for d in deltas)
    else:
        message = tool_client.chat.completions.create(**kwargs, extra_body=hidden).choices[0]
        dumped = message.message.model_dump()
        assert dumped.get("reasoning_content") is None and dumped.get("reasoning") is None
        content = message.message.content
    assert content == shown.content


def test_history_reasoning_under_either_name_reaches_the_template(tool_server):
    """An assistant turn sent back with vLLM's newer `reasoning` field renders as one with
    reasoning_content (templates read the latter)."""
    import httpx

    def prompt(field: str) -> str:
        history = [*MESSAGES, {"role": "assistant", "content": "7", field: "I like 7."},
                   {"role": "user", "content": "Again."}]
        ids = httpx.post(f"{tool_server.url}/tokenize", json={"messages": history},
                         timeout=30).json()["tokens"]
        return httpx.post(f"{tool_server.url}/detokenize", json={"tokens": ids},
                          timeout=30).json()["prompt"]

    assert "I like 7." in prompt("reasoning") and prompt("reasoning") == \
        prompt("reasoning_content")


def test_usage_counts_reasoning_tokens_whole_and_streamed(tool_client, tool_server, client,
                                                          server):
    """As vLLM with a reasoning parser: usage.completion_tokens_details.reasoning_tokens
    counts the thinking span's tokens (its end tag included), in the body and in the stream's
    usage chunk; a server without a parser sends no details."""
    r = _ask(tool_client, tool_server, 3, seed=11, logprobs=True)
    tokens = [entry.token for entry in r.choices[0].logprobs.content]
    thinking = tokens.index("</think>") + 1
    assert r.usage.completion_tokens_details.reasoning_tokens == thinking
    chunks = list(_ask(tool_client, tool_server, 3, seed=11, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thinking
    plain = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=2)
    assert plain.usage.completion_tokens_details is None


@pytest.mark.parametrize("effort,kwargs,thinks", [
    ("low", {}, True), ("none", {}, False),
    ("none", {"chat_template_kwargs": {"enable_thinking": True}}, True),  # the kwargs win
])
def test_reasoning_effort_reaches_the_template(tool_client, tool_server, effort, kwargs,
                                                thinks):
    """vLLM's reasoning_effort: a template variable, and enable_thinking on unless "none"
    (this template thinks only when asked), unless chat_template_kwargs sets it."""
    r = tool_client.chat.completions.create(
        model=tool_server.model, messages=MESSAGES, max_tokens=40, temperature=1.0, seed=4,
        response_format=FORMAT, reasoning_effort=effort,
        extra_body={**kwargs, "thinking_token_budget": 4})
    message = r.choices[0].message
    assert bool(getattr(message, "reasoning_content", None)) == thinks
    jsonschema.validate(json.loads(message.content), SCHEMA)


def test_unknown_reasoning_effort_is_a_400(tool_client, tool_server):
    with pytest.raises(openai.BadRequestError) as info:
        tool_client.chat.completions.create(model=tool_server.model, messages=MESSAGES,
                                            max_tokens=4, extra_body={"reasoning_effort": "huge"})
    assert info.value.body["param"] == "reasoning_effort"
