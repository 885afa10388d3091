"""Each tool-call parser on replies in its model family's format: whole, and streamed in
pieces of every size (tags split across deltas), the deltas adding up to the same calls."""

from __future__ import annotations

import json

import pytest

from compiled_llm.entrypoints.tool_parsers import TOOL_PARSERS, get_tool_parser
from compiled_llm.entrypoints.tool_parsers.base import ToolCallStreamer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "units": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string"}}}}}]
WEATHER = ("get_weather", {"city": "Paris", "days": 3})
TIME = ("get_time", {"zone": "CET"})

# (parser, reply, expected content (whitespace kept, as streamed), expected calls)
CASES = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris", "days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
               '"arguments": {"zone": "CET"}}\n</tool_call>', "Let me look.\n", [WEATHER, TIME]),
    ("hermes", '<tool_call>\n{"arguments": {"zone": "CET"}, "name": "get_time"}\n</tool_call>',
     None, [TIME]),
    ("hermes", "No tools needed: 2 < 3.", "No tools needed: 2 < 3.", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
     None, [WEATHER]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"days": 3}}; {"name": "get_time", "parameters": {"zone": "CET"}}',
     None, [WEATHER, TIME]),
    ("llama3_json", "The weather is fine.", "The weather is fine.", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 3}}, {"name": "get_time", "arguments": {"zone": "CET"}}]',
     None, [WEATHER, TIME]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
                '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}', "Sure.", [WEATHER, TIME]),
    ("qwen3_coder", "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                    "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                    "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n"
                    "</parameter>\n</function>\n</tool_call>", "I will check.\n",
     [WEATHER, TIME]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n3\n</parameter>\n"
                    "</function>\n</tool_call>", None, [("get_weather", {"city": "3"})]),
    ("pythonic", '[get_weather(city="Paris", days=3), get_time(zone=\'CET\')]', None,
     [WEATHER, TIME]),
    ("pythonic", "It is sunny [citation].", "It is sunny [citation].", []),
]


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
def test_whole_reply(name, reply, content, calls):
    got_content, got_calls = get_tool_parser(name)(TOOLS).extract(reply)
    assert got_content == content
    assert _calls(got_calls) == calls
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function"
               for c in got_calls)


def _stream(name: str, reply: str, size: int) -> tuple[str, dict[int, dict]]:
    """The reply fed `size` characters at a time: content and the calls the deltas build."""
    streamer = ToolCallStreamer(get_tool_parser(name)(TOOLS).parse)
    content, calls = "", {}
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for i, piece in enumerate(pieces):
        text, deltas = streamer.feed(piece, final=i == len(pieces) - 1)
        content += text
        for delta in deltas:
            if delta["index"] not in calls:  # a call's first delta: id, type and name
                assert delta["index"] == len(calls)
                assert delta["id"].startswith("chatcmpl-tool-") and delta["type"] == "function"
                calls[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
            else:
                assert set(delta) == {"index", "function"} and "name" not in delta["function"]
            calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return content, calls


@pytest.mark.parametrize("size", [1, 2, 5, 13])
@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
def test_streamed_reply(name, reply, content, calls, size):
    got_content, got_calls = _stream(name, reply, size)
    assert got_content == (content or "")  # the whole reply's content, byte for byte
    assert [(c["name"], json.loads(c["arguments"])) for c in got_calls.values()] == calls


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_unfinished_call_is_content(name):
    """A reply cut off inside a call (max_tokens) has no calls; its text is the content."""
    reply = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
             "llama3_json": '{"name": "get_weather", "parameters": {"city": "Pa',
             "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci',
             "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
             "pythonic": '[get_weather(city="Pa',
             "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa",
             "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa",
             "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                            'get_weather\n```json\n{"city": "Pa',
             "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                             '<｜tool▁sep｜>{"city": "Pa',
             "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Pa',
             "phi4_mini_json": 'functools[{"name": "get_weather", "arguments": {"city": "Pa',
             "llama4_pythonic": '<|python_start|>[get_weather(city="Pa',
             "seed_oss": "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
             "minimax_m2": '<minimax:tool_call><invoke name="get_weather"><parameter '
                           'name="city">Pa',
             "openai": '<|channel|>commentary to=functions.get_weather <|constrain|>json'
                       '<|message|>{"city": "Pa'}.get(name)
    if reply is None:  # the families test_vllm_name_parsers covers (imported late: it uses ours)
        from tests.entrypoints.tool_parsers.test_vllm_name_parsers import UNFINISHED
        reply = UNFINISHED[name]
    assert get_tool_parser(name)(TOOLS).extract(reply) == (reply, [])


def test_partial_marker_is_held_back():
    streamer = ToolCallStreamer(get_tool_parser("hermes")(TOOLS).parse)
    assert streamer.feed("Hi <tool_", False) == ("Hi ", [])
    assert streamer.feed("tip>", True) == ("<tool_tip>", [])


def test_name_streams_before_arguments():
    streamer = ToolCallStreamer(get_tool_parser("hermes")(TOOLS).parse)
    assert streamer.feed('<tool_call>{"name": "get_wea', False) == ("", [])
    _, [first] = streamer.feed('ther", "arguments": {"ci', False)
    assert first["function"] == {"name": "get_weather", "arguments": '{"ci'}
    _, [more] = streamer.feed('ty": "Rome"}}</tool_call>', True)
    assert more == {"index": 0, "function": {"arguments": 'ty": "Rome"}'}}


def test_unknown_parser_lists_known():
    with pytest.raises(ValueError, match="hermes.*pythonic"):
        get_tool_parser("nope")
