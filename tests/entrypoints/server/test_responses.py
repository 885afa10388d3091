"""/v1/responses on a live server through the official `openai` client: text and message
input (greedy output equal to chat completions'), streamed events in the SDK's order, the
stream and parse helpers, text.format structured output, usage, incomplete status, and a 400
naming the field for everything it does not support, the server serving on."""

from __future__ import annotations

import itertools
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.entrypoints.server.conftest import API_KEY

ABORTS = "compiled_llm:request_success_total[abort]"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick"}]
YES_NO = {"type": "json_schema", "name": "yes_no", "schema": {"enum": ["yes", "no"]},
          "strict": True}
PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added", "response.output_text.delta",
          "response.output_text.done", "response.content_part.done",
          "response.output_item.done"]


def _chat_text(client, server, messages, max_tokens):
    r = client.chat.completions.create(model=server.model, messages=messages, temperature=0,
                                       max_tokens=max_tokens)
    return r.choices[0], r.usage


def test_text_input_equals_chat_greedy(client, server):
    r = client.responses.create(model=server.model, input="The quick", instructions="Be brief.",
                                max_output_tokens=10, temperature=0, store=True)
    choice, usage = _chat_text(client, server, CHAT, 10)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == choice.message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (usage.prompt_tokens,
                                                             usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    expected = "incomplete" if choice.finish_reason == "length" else "completed"
    assert r.status == r.output[0].status == expected
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"


def test_message_items_equal_chat_greedy(client, server):
    items = [{"role": "developer", "content": "Answer."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "The"},
                          {"type": "input_text", "text": "quick"}]},  # joined by "\n", as vLLM
             {"role": "assistant", "content": [{"type": "output_text", "text": "brown"}]},
             {"role": "user", "content": "fox"}]
    r = client.responses.create(model=server.model, input=items, max_output_tokens=8,
                                temperature=0)
    chat = [{"role": "developer", "content": "Answer."}, {"role": "user", "content": "The\nquick"},
            {"role": "assistant", "content": "brown"}, {"role": "user", "content": "fox"}]
    choice, usage = _chat_text(client, server, chat, 8)
    assert r.output_text == choice.message.content
    assert r.usage.input_tokens == usage.prompt_tokens  # the same prompt, parts and all


def test_stream_events_in_order(client, server):
    kw = dict(model=server.model, input="The quick", max_output_tokens=12, temperature=0,
              include=["message.output_text.logprobs"], top_logprobs=2)
    full = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds[:-1] == EVENTS[:5] + ["response.output_text.delta"] * (deltas - 1) + EVENTS[5:]
    assert kinds[-1] == "response.completed" and events[-1].response.status == full.status
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == events[-4].text == final.output_text == full.output_text
    assert final.usage.output_tokens == full.usage.output_tokens
    assert events[-2].item.id == events[2].item.id == final.output[0].id
    logprobs = final.output[0].content[0].logprobs
    assert len(logprobs) == full.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs)
    tokens = [lp.token for lp in logprobs]
    assert tokens == [lp.token for lp in full.output[0].content[0].logprobs]
    assert tokens == [lp.token for lp in events[-4].logprobs]
    # a last token that is part of a character has no text, so no delta: done carries it
    streamed = [lp.token for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert streamed == tokens[:len(streamed)] and len(streamed) >= len(tokens) - 3


def test_stream_helper_and_json_schema(client, server):
    with client.responses.stream(model=server.model, input="yes or no?", temperature=1.0,
                                 max_output_tokens=20, text={"format": YES_NO}) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and "".join(texts) == final.output_text
    assert json.loads(final.output_text) in ("yes", "no")
    assert final.text.format.type == "json_schema"


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=99)


def test_parse_pydantic_and_json_schema(client, server):
    parsed = client.responses.parse(model=server.model, input="a person", text_format=Person,
                                    max_output_tokens=120, temperature=1.0,
                                    extra_body={"seed": 3})
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    for seed in range(4):
        r = client.responses.create(
            model=server.model, input="JSON", max_output_tokens=120, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
            extra_body={"seed": seed})
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), PERSON)


def test_json_object(client, server):
    done = []
    for seed in range(6):
        r = client.responses.create(model=server.model, input="x", temperature=1.0,
                                    max_output_tokens=150, text={"format": {"type": "json_object"}},
                                    extra_body={"seed": seed})
        if r.status == "completed":  # a random model may write long strings; what ends parses
            done.append(json.loads(r.output_text))
    assert done and all(isinstance(obj, dict) for obj in done)


def test_incomplete_at_max_output_tokens(client, server):
    kw = dict(model=server.model, input="The quick", max_output_tokens=3,
              extra_body={"ignore_eos": True})
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = list(client.responses.create(**kw, stream=True))
    # vLLM's last event: response.completed, its response's status telling the cut
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-2].item.status == "incomplete"


def test_stream_cut_by_max_output_tokens_has_a_final_response(client, server):
    # the SDK's .stream() builds get_final_response() from response.completed only; a
    # vLLM client reads a cut stream's final response so
    with client.responses.stream(model=server.model, input="The quick", max_output_tokens=3,
                                 extra_body={"ignore_eos": True}) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "incomplete" and final.usage.output_tokens == 3
    assert final.output_text == deltas


def _fmt(schema):
    return {"format": {"type": "json_schema", "name": "x", "schema": schema}}


def _input(*content, role="user"):
    return [{"role": role, "content": list(content)}]


# (id, fields added to a small valid body, expected param)
REFUSED = [
    ("auto tools without the server flag",
     {"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tool_choice"),
    ("built-in tool", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("tool_choice required", {"tool_choice": "required"}, "tool_choice"),
    ("max_tool_calls", {"max_tool_calls": 2}, "max_tool_calls"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("background", {"background": True}, "background"),
    ("prompt template", {"prompt": {"id": "pmpt_1"}}, "prompt"),
    ("truncation auto", {"truncation": "auto"}, "truncation"),
    ("reasoning summary", {"reasoning": {"summary": "auto"}}, "reasoning"),
    ("reasoning effort unknown", {"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ("verbosity", {"text": {"verbosity": "low"}}, "text.verbosity"),
    ("include", {"include": ["file_search_call.results"]}, "include"),
    ("response_format", {"response_format": {"type": "json_object"}}, "response_format"),
    ("n", {"n": 2}, "n"),
    ("image part", {"input": _input({"type": "input_image", "image_url": "http://x/a.png"})},
     "input[0].content[0].type"),
    ("file part", {"input": _input({"type": "input_file", "file_id": "f"})},
     "input[0].content[0].type"),
    ("part without text", {"input": _input({"type": "input_text"})}, "input[0].content[0].text"),
    ("function_call of no tool", {"input": [{"type": "function_call", "call_id": "c",
                                             "name": "f", "arguments": "{}"}]}, "input[0].name"),
    ("encrypted reasoning item", {"input": [{"type": "reasoning", "summary": [],
                                             "encrypted_content": "gAAA"}]},
     "input[0].encrypted_content"),
    ("tool role", {"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ("empty input", {"input": []}, "input"),
    ("input too long", {"input": "fox " * 600}, "input"),
    ("max_output_tokens 0", {"max_output_tokens": 0}, "max_output_tokens"),
    ("max_output_tokens over context", {"max_output_tokens": 600}, "max_output_tokens"),
    ("top_logprobs range", {"top_logprobs": 50}, "top_logprobs"),
    ("schema missing", {"text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ("schema invalid", {"text": _fmt({"type": "objectx"})}, "text.format"),
    ("format type", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ("temperature", {"temperature": -1}, "temperature"),
    ("stream_options without stream", {"stream_options": {"include_obfuscation": False}},
     "stream_options"),
]


@pytest.mark.parametrize("fields,param", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_with_400_naming_the_field(server, fields, param):
    body = {"model": server.model, "input": "hi", "max_output_tokens": 4, **fields}
    r = httpx.post(f"{server.url}/v1/responses", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_errors_through_the_client_and_still_serving(client, server):
    with pytest.raises(openai.NotFoundError, match="'resp_1' not found"):
        client.responses.create(model=server.model, input="hi", previous_response_id="resp_1")
    with pytest.raises(openai.NotFoundError, match="'resp_1' not found"):
        client.responses.retrieve("resp_1")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-9", input="hi")
    r = client.responses.create(model=server.model, input="hi", max_output_tokens=2)
    assert r.usage.output_tokens <= 2
    assert server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0


def test_client_leaving_mid_stream_frees_the_request(server):
    body = {"model": server.model, "input": "The quick", "max_output_tokens": 400,
            "stream": True, "ignore_eos": True}
    aborts = server.wait_idle()[ABORTS]
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, headers=AUTH,
                      timeout=60) as r:
        kinds = list(itertools.islice(
            (line for line in r.iter_lines() if line.startswith("event: ")), 6))
    assert kinds[-1] == "event: response.output_text.delta"  # gone after two deltas
    idle = server.wait_idle()
    assert idle[ABORTS] == aborts + 1 and idle["compiled_llm:kv_cache_used_blocks"] == 0
