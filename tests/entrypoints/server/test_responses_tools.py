"""Function tools and reasoning on /v1/responses through a live server (hermes tool calls,
qwen3 reasoning) with the official openai client: required and named calls as function_call
items that parse and validate, auto parsed from what the model writes (forced by a regex),
none, streamed calls and reasoning reassembled by the SDK's stream helper, a tool result sent
back by call_id rendered as chat's history, the reasoning item, and each new 400."""

# ruff: noqa: F811  (the session fixtures are imported by name)
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.entrypoints.server.test_tools import HERMES_CALL, MESSAGES, SCHEMAS, TIME, WEATHER
from tests.entrypoints.server.tool_model import tool_client, tool_server  # noqa: F401

TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
         {"type": "function", "name": "get_time", "description": "The time.",
          "parameters": TIME, "strict": True}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
              for tool in TOOLS]
THINK = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 3}
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


def _create(client, server, **kwargs):
    kwargs = {"max_output_tokens": 120, "temperature": 1.0, "tools": TOOLS, **kwargs}
    return client.responses.create(model=server.model, input=MESSAGES, **kwargs)


def _validate(item, name: str | None = None) -> None:
    assert item.type == "function_call" and item.status == "completed"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert name is None or item.name == name
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_call_is_a_function_call_item(tool_client, tool_server, seed):
    r = _create(tool_client, tool_server, tool_choice="required", parallel_tool_calls=False,
                extra_body={"seed": seed})
    assert r.status == "completed" and r.tool_choice == "required"
    [item] = r.output  # the call alone: no message item
    _validate(item)
    assert [tool.name for tool in r.tools] == ["get_weather", "get_time"]


def test_named_call(tool_client, tool_server):
    r = _create(tool_client, tool_server, tool_choice={"type": "function", "name": "get_time"},
                extra_body={"seed": 3})
    [item] = r.output
    _validate(item, "get_time")
    assert r.tool_choice.name == "get_time"


def test_auto_parses_what_the_model_writes(tool_client, tool_server):
    r = _create(tool_client, tool_server, tool_choice="auto",
                extra_body={"seed": 4, "structured_outputs": {"regex": HERMES_CALL}})
    [item] = r.output
    _validate(item, "get_weather")


def test_none_answers_with_a_message(tool_client, tool_server):
    r = _create(tool_client, tool_server, tool_choice="none", max_output_tokens=6,
                temperature=0.0)
    assert [item.type for item in r.output] == ["message"]


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_streamed_call_reassembles(tool_client, tool_server, tool_choice):
    """The SDK's stream helper rebuilds the call from the events (in order, numbered); it
    equals the call of the same request unstreamed (same seed)."""
    extra = {"seed": 5} | ({"structured_outputs": {"regex": HERMES_CALL}}
                           if tool_choice == "auto" else {})
    kwargs = dict(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False,
                  max_output_tokens=120, temperature=1.0, extra_body=extra)
    with tool_client.responses.stream(model=tool_server.model, input=MESSAGES,
                                      **kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert kinds == ["response.created", "response.in_progress", CALL_EVENTS[0],
                     *[CALL_EVENTS[1]] * deltas, *CALL_EVENTS[2:], "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [item] = final.output
    _validate(item)
    assert "".join(e.delta for e in events if e.type == CALL_EVENTS[1]) == item.arguments
    assert events[2].item.call_id == item.call_id and events[-3].arguments == item.arguments
    [whole] = _create(tool_client, tool_server, **kwargs).output
    assert (whole.name, whole.arguments) == (item.name, item.arguments)


def test_tool_result_round_trip(tool_client, tool_server):
    """The call's items sent back with a function_call_output render as chat's history of
    the same turn: greedy answers are equal."""
    call = _create(tool_client, tool_server, tool_choice="required", parallel_tool_calls=False,
                   extra_body={"seed": 6}).output[0]
    items = [*MESSAGES, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r = tool_client.responses.create(model=tool_server.model, input=items, tools=TOOLS,
                                     tool_choice="none", max_output_tokens=8, temperature=0)
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    chat = tool_client.chat.completions.create(model=tool_server.model, messages=history,
                                               tools=CHAT_TOOLS, tool_choice="none",
                                               max_tokens=8, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_output_items_fed_back_as_agents_do(tool_client, tool_server):
    """An agent sends every output item back (reasoning, message, calls as the SDK dumps
    them) with the tools' outputs: accepted, and the reasoning renders as chat's
    reasoning_content of that assistant turn (same prompt length)."""
    first = _create(tool_client, tool_server, tool_choice="required", parallel_tool_calls=False,
                    max_output_tokens=160, extra_body={**THINK, "seed": 8})
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    items = [*MESSAGES, *(item.model_dump(exclude_none=True) for item in first.output),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r = tool_client.responses.create(model=tool_server.model, input=items, tools=TOOLS,
                                     tool_choice="none", max_output_tokens=2, store=False)
    history = [*MESSAGES, {"role": "assistant", "content": None,
                           "reasoning_content": reasoning.content[0].text, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    chat = tool_client.chat.completions.create(model=tool_server.model, messages=history,
                                               tools=CHAT_TOOLS, tool_choice="none",
                                               max_tokens=2)
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def _think(client, server, **kwargs):
    return client.responses.create(model=server.model, input="Pick a digit.", temperature=1.0,
                                   max_output_tokens=12, extra_body={**THINK, "seed": 7},
                                   **kwargs)


def test_reasoning_item_before_the_message(tool_client, tool_server):
    r = _think(tool_client, tool_server, include=["message.output_text.logprobs"])
    chat = tool_client.chat.completions.create(
        model=tool_server.model, messages=[{"role": "user", "content": "Pick a digit."}],
        temperature=1.0, max_tokens=12, extra_body={**THINK, "seed": 7}).choices[0].message
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.content[0].type == "reasoning_text"
    assert reasoning.content[0].text == chat.reasoning_content and "</think>" not in r.output_text
    assert message.type == "message" and r.output_text == chat.content
    thinking = r.usage.output_tokens_details.reasoning_tokens
    assert 1 <= thinking <= THINK["thinking_token_budget"] + 1
    # max_output_tokens counts the thinking; the message's logprobs are its own tokens only
    assert r.usage.output_tokens <= 12
    assert len(message.content[0].logprobs) == r.usage.output_tokens - thinking


def test_streamed_reasoning(tool_client, tool_server):
    whole = _think(tool_client, tool_server)
    with tool_client.responses.stream(model=tool_server.model, input="Pick a digit.",
                                      temperature=1.0, max_output_tokens=12,
                                      extra_body={**THINK, "seed": 7}) as stream:
        events = list(stream)
    final = events[-1].response  # "incomplete" when the 12 tokens run out
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed" and final.status == whole.status
    first_text = kinds.index("response.output_text.delta") if whole.output_text else len(kinds)
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds.index("response.reasoning_text.done") < first_text
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == whole.output[0].content[0].text == final.output[0].content[0].text
    assert final.output_text == whole.output_text
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.usage.output_tokens_details.reasoning_tokens == \
        whole.usage.output_tokens_details.reasoning_tokens


def _call_item(**fields):
    return {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris", "days": 2}', **fields}


# (id, fields over a small valid body, expected param)
BAD = [
    ("schema", {"tools": [{"type": "function", "name": "f", "parameters": "x"}]},
     "tools[0].parameters"),
    ("schema type", {"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}]},
     "tools[0].parameters.properties.a"),
    ("name", {"tools": [{"type": "function", "name": "has space"}]}, "tools[0].name"),
    ("twice", {"tools": [{"type": "function", "name": "f"}] * 2}, "tools[1].name"),
    ("chat-shaped tool", {"tools": CHAT_TOOLS}, "tools[0].name"),
    ("unknown named", {"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ("built-in choice", {"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ("bad choice", {"tool_choice": "sometimes"}, "tool_choice"),
    ("required without tools", {"tools": None, "tool_choice": "required"}, "tool_choice"),
    ("required with text.format", {"tool_choice": "required",
                                   "text": {"format": {"type": "json_object"}}}, "tool_choice"),
    ("logprobs with tools", {"include": ["message.output_text.logprobs"]}, "include"),
    ("top_logprobs with tools", {"tool_choice": "required", "top_logprobs": 2}, "top_logprobs"),
    ("max_tool_calls", {"max_tool_calls": 1}, "max_tool_calls"),
    ("reasoning summary", {"reasoning": {"generate_summary": "concise"}}, "reasoning"),
    ("output of no call", {"input": [*MESSAGES, {"type": "function_call_output",
                                                 "call_id": "call_9", "output": "x"}]},
     "input[1].call_id"),
    ("call of no tool", {"input": [*MESSAGES, _call_item(name="nope")]}, "input[1].name"),
    ("arguments not JSON", {"input": [*MESSAGES, _call_item(arguments="{no")]},
     "input[1].arguments"),
    ("call_id missing", {"input": [*MESSAGES, _call_item(call_id=None)]}, "input[1].call_id"),
    ("call_id twice", {"input": [*MESSAGES, _call_item(), _call_item()]}, "input[2].call_id"),
    ("output parts", {"input": [*MESSAGES, _call_item(), {
        "type": "function_call_output", "call_id": "call_1",
        "output": [{"type": "input_image"}]}]}, "input[2].output[0].type"),
]


@pytest.mark.parametrize("fields,param", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_a_400_naming_the_field(tool_server, fields, param):
    body = {"model": tool_server.model, "input": MESSAGES, "tools": TOOLS,
            "max_output_tokens": 4, **fields}
    r = httpx.post(f"{tool_server.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_still_serving_after_bad_input(tool_client, tool_server):
    _validate(_create(tool_client, tool_server, tool_choice="required",
                      parallel_tool_calls=False).output[0])
    assert tool_server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0


@pytest.mark.parametrize("effort,thinks", [("medium", True), ("none", False)])
def test_reasoning_effort_turns_thinking_on_or_off(tool_client, tool_server, effort, thinks):
    """reasoning.effort reaches the template as chat's reasoning_effort does."""
    r = tool_client.responses.create(model=tool_server.model, input="Pick a digit.",
                                     temperature=1.0, max_output_tokens=12,
                                     reasoning={"effort": effort},
                                     extra_body={"seed": 7, "thinking_token_budget": 3})
    assert (r.output[0].type == "reasoning") == thinks
