"""Tool calling through a live server with the official openai client and LangChain: required
and named calls enforced by a grammar (they parse and validate), auto calls parsed from what
the model writes (forced here by a regex, as a tiny random model writes no calls of its own),
streamed tool-call deltas reassembled by the client, none, the history, and bad input."""

# ruff: noqa: F811  (the session fixtures are imported by name)
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest

from tests.entrypoints.server.conftest import ROOT
from tests.entrypoints.server.tool_model import tool_client, tool_server  # noqa: F401

WEATHER = {"type": "object", "required": ["city", "days"], "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME = {"type": "object", "required": ["zone"], "properties": {
    "zone": {"type": "string", "maxLength": 4}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", '
               r'"days": [1-7]\}\}\n</tool_call>')


def _chat(client, server, **kwargs):
    kwargs = {"max_tokens": 120, **kwargs}
    return client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS,
                                          **kwargs)


def _validate(call) -> None:
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_parse_and_validate(tool_client, tool_server):
    r = _chat(tool_client, tool_server, tool_choice="required", n=6, temperature=1.0, seed=1,
              parallel_tool_calls=False)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "" and len(choice.message.tool_calls) == 1
        _validate(choice.message.tool_calls[0])


def test_named_call_parses_and_validates(tool_client, tool_server):
    r = _chat(tool_client, tool_server, n=4, temperature=1.0, seed=2,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    for choice in r.choices:
        assert choice.finish_reason == "stop" and choice.message.content == ""
        [call] = choice.message.tool_calls
        assert call.function.name == "get_time"
        _validate(call)


def test_auto_parses_what_the_model_writes(tool_client, tool_server):
    r = _chat(tool_client, tool_server, tool_choice="auto", temperature=1.0, seed=3,
              extra_body={"structured_outputs": {"regex": HERMES_CALL}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _validate(call)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_streamed_calls_reassemble(tool_client, tool_server, tool_choice):
    """The client's own stream helper rebuilds the calls from the deltas; they equal the
    calls of the same request unstreamed (same seed)."""
    kwargs = dict(tool_choice=tool_choice, temperature=1.0, seed=4, parallel_tool_calls=False)
    if tool_choice == "auto":
        kwargs["extra_body"] = {"structured_outputs": {"regex": HERMES_CALL}}
    with tool_client.chat.completions.stream(model=tool_server.model, messages=MESSAGES,
                                             tools=TOOLS, max_tokens=120, **kwargs) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0]
    whole = _chat(tool_client, tool_server, **kwargs).choices[0]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    _validate(streamed.message.tool_calls[0])


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_false_keeps_the_first_auto_call(tool_client, tool_server, stream):
    """vLLM's maybe_filter_parallel_tool_calls: a reply of two calls (forced by a regex)
    with parallel_tool_calls=false gives the first call only, whole or streamed."""
    kwargs = dict(tool_choice="auto", temperature=1.0, seed=9, parallel_tool_calls=False,
                  max_tokens=240, extra_body={"structured_outputs": {
                      "regex": f"{HERMES_CALL}\\n{HERMES_CALL}"}})
    if stream:
        with tool_client.chat.completions.stream(model=tool_server.model, messages=MESSAGES,
                                                 tools=TOOLS, **kwargs) as events:
            choice = events.get_final_completion().choices[0]
    else:
        choice = _chat(tool_client, tool_server, **kwargs).choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    _validate(call)
    both = _chat(tool_client, tool_server, **{**kwargs, "parallel_tool_calls": True})
    assert len(both.choices[0].message.tool_calls) == 2


def test_required_with_nested_pydantic_models_parses(tool_client, tool_server):
    """pydantic's nested models are "$ref"s into the parameters' "$defs": the required-call
    grammar (the parameters nested in a list) hoists them to its root, so they compile and
    the client's parse helper reads the call back as the model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: Literal["Paris", "Rome"]

    class Trip(BaseModel):
        start: Place
        stops: list[Place] = Field(max_length=2)

    r = tool_client.chat.completions.parse(
        model=tool_server.model, messages=MESSAGES, tools=[openai.pydantic_function_tool(Trip)],
        tool_choice="required", parallel_tool_calls=False, max_tokens=400, temperature=1.0,
        seed=10)
    [call] = r.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Trip)


def test_none_never_calls_and_tools_reach_the_template(tool_client, tool_server):
    r = _chat(tool_client, tool_server, tool_choice="none", temperature=0.0, max_tokens=8)
    assert not r.choices[0].message.tool_calls  # vLLM: an empty list
    assert r.choices[0].finish_reason in ("stop", "length")
    ids = httpx.post(f"{tool_server.url}/tokenize", json={"messages": MESSAGES, "tools": TOOLS},
                     timeout=30).json()["tokens"]
    prompt = httpx.post(f"{tool_server.url}/detokenize", json={"tokens": ids},
                        timeout=30).json()["prompt"]
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt


def test_history_with_tool_calls(tool_client, tool_server):
    """An assistant call (arguments a JSON string) and the tool's answer render as the
    template expects (arguments as an object) and the next turn is answered."""
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = tool_client.chat.completions.create(model=tool_server.model, messages=history,
                                            tools=TOOLS, tool_choice="none", max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    ids = httpx.post(f"{tool_server.url}/tokenize", json={"messages": history, "tools": TOOLS},
                     timeout=30).json()["tokens"]
    prompt = httpx.post(f"{tool_server.url}/detokenize", json={"tokens": ids},
                        timeout=30).json()["prompt"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]},
     "tools[0].function.parameters.properties.a"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools[1].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{"id": "x"}]}]},
     "messages[1].tool_calls[0].function"),
]


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field(tool_server, body, param):
    r = httpx.post(f"{tool_server.url}/v1/chat/completions", timeout=30,
                   json={"model": tool_server.model, "messages": MESSAGES, "max_tokens": 4,
                         **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_still_serving_after_bad_input(tool_client, tool_server):
    r = _chat(tool_client, tool_server, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].message.tool_calls
    assert tool_server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0


def test_auto_needs_the_server_flag(client, server):
    """The plain test server has no --enable-auto-tool-choice: "auto" (the default with
    tools) is a 400, as vLLM answers; required still works."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS,
                                       max_tokens=4)
    assert info.value.body["message"] == (  # vLLM's words
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=120)
    assert r.choices[0].finish_reason == "tool_calls"


def test_unknown_parser_fails_at_startup():
    out = subprocess.run([sys.executable, "-m", "compiled_llm.entrypoints.cli", "serve",
                          "--tool-call-parser", "nope"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert "tool_call_parser must be one of" in out.stderr and "hermes" in out.stderr


def test_langchain_bind_tools_and_structured_output(tool_server):
    from typing import Literal

    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """Weather in a city for some days."""

        city: Literal["Paris", "Rome"]
        days: int = Field(ge=1, le=7)

    llm = ChatOpenAI(base_url=f"{tool_server.url}/v1", api_key="none", model=tool_server.model,
                     max_tokens=120, temperature=1.0, seed=5, max_retries=0)
    message = llm.bind_tools([Weather], tool_choice="any", parallel_tool_calls=False).invoke(
        "Weather in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "Weather" and Weather(**call["args"])
    result = llm.with_structured_output(Weather, method="function_calling").invoke("Weather?")
    assert isinstance(result, Weather) and 1 <= result.days <= 7
