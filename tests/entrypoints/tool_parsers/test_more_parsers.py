"""The parsers added for more of vLLM's names (GLM-4.5/4.7, DeepSeek V3/V3.1, ...) on replies
in each family's format: whole, streamed in pieces of every size, cut off anywhere, with two
calls, schema-typed arguments, content before the calls and malformed calls kept as text."""

from __future__ import annotations

import json

import pytest

from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from compiled_llm.entrypoints.tool_parsers.base import ToolCallStreamer
from tests.entrypoints.tool_parsers.test_streamed_ends import _check_end
from tests.entrypoints.tool_parsers.test_tool_parsers import TIME, TOOLS, WEATHER, _stream

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

# (parser, reply, expected content (whitespace kept, as streamed), expected calls)
CASES = [
    ("glm45", "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
              "Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
              "</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET"
              "</arg_value>\n</tool_call>", "Let me check.\n", [WEATHER, TIME]),
    # a string parameter stays a string (even "3"); a number is read as JSON
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>3</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value> 7 </arg_value>\n</tool_call>", None,
     [("get_weather", {"city": "3", "days": 7})]),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
              "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time"
              "<arg_key>zone</arg_key><arg_value>CET</arg_value></tool_call>", None,
     [WEATHER, TIME]),
    ("glm47", "<tool_call>get_time</tool_call>", None, [("get_time", {})]),
    ("glm45", "No tools: 2 < 3.", "No tools: 2 < 3.", []),
    ("deepseek_v3", f"Sure.{B}{CB}function{SEP}get_weather\n```json\n"
                    '{"city": "Paris", "days": 3}\n```' f"{CE}\n{CB}function{SEP}get_time\n"
                    '```json\n{"zone": "CET"}\n```' f"{CE}{E}", "Sure.", [WEATHER, TIME]),
    ("deepseek_v3", "All good.", "All good.", []),
    ("deepseek_v31", f"Sure.{B}{CB}get_weather{SEP}" '{"city": "Paris", "days": 3}'
                     f"{CE}{CB}get_time{SEP}" '{"zone": "CET"}' f"{CE}{E}", "Sure.",
     [WEATHER, TIME]),
    ("deepseek_v31", f"{B}{CB}get_time{SEP}" '{"zone": "CET"}' f"{CE}{E}", None, [TIME]),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 3}}, {"name": "get_time", "arguments": {"zone": "CET"}}]', None,
     [WEATHER, TIME]),
    ("granite", ' <tool_call>[{"name": "get_time", "arguments": {"zone": "CET"}}]', None,
     [TIME]),
    ("granite", "[1] is a citation.", "[1] is a citation.", []),
    ("phi4_mini_json", 'I will call. functools[{"name": "get_weather", "arguments": {"city": '
                       '"Paris", "days": 3}}, {"name": "get_time", "parameters": {"zone": '
                       '"CET"}}]', "I will call. ", [WEATHER, TIME]),
    ("phi4_mini_json", "Use functools.partial.", "Use functools.partial.", []),
    ("llama4_pythonic", '<|python_start|>[get_weather(city="Paris", days=3), '
                        "get_time(zone='CET')]<|python_end|>", None, [WEATHER, TIME]),
    ("llama4_pythonic", '[get_time(zone="CET")]', None, [TIME]),
    ("llama4_pythonic", "<|python_start|>print(1)<|python_end|>",
     "<|python_start|>print(1)<|python_end|>", []),
    ("seed_oss", "Checking.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris"
                 "</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>"
                 "<seed:tool_call>\n<function=get_time>\n<parameter=zone>CET</parameter>\n"
                 "</function>\n</seed:tool_call>", "Checking.\n", [WEATHER, TIME]),
    ("seed_oss", "<tool_call> is not Seed's tag.", "<tool_call> is not Seed's tag.", []),
    ("minimax_m2", 'Let me see.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
                   '<parameter name="city">Paris</parameter>\n<parameter name="days">3'
                   '</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="zone">'
                   "CET</parameter>\n</invoke>\n</minimax:tool_call>", "Let me see.\n",
     [WEATHER, TIME]),
    ("minimax_m2", '<minimax:tool_call><invoke name="get_weather"><parameter name="city">3'
                   '</parameter><parameter name="units">null</parameter></invoke>'
                   '</minimax:tool_call><minimax:tool_call><invoke name="get_time"></invoke>'
                   "</minimax:tool_call>", None,
     [("get_weather", {"city": "3", "units": None}), ("get_time", {})]),
]

# replies whose calls do not parse: all of the text is content, no calls
MALFORMED = [
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa"),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key> junk </tool_call>"),
    ("glm47", "<tool_call></tool_call>"),
    ("deepseek_v3", f"{B}{CB}function{SEP}get_time\n```json\n" '{"zone": "CET"'),
    ("deepseek_v3", f"{B}{CB}function{SEP}get_time\n" '{"zone": "CET"}' f"{CE}{E}"),
    ("deepseek_v31", f"{B}{CB}get_time{SEP}" '{"zone": CET}' f"{CE}{E}"),
    ("deepseek_v31", f"{B}{CB}get_time{SEP}[1]{CE}{E}"),
    ("deepseek_v31", f"{B}nothing here{E}"),
    ("granite", '[{"name": "get_time", "arguments": {"zone": "CET"}}] and more'),
    ("granite", '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "CET"'),
    ("phi4_mini_json", 'functools[{"name": "get_time", "arguments": {"zone": CET}}]'),
    ("phi4_mini_json", "functools[]"),
    ("llama4_pythonic", '<|python_start|>[get_time(zone="CET")'),
    ("llama4_pythonic", "[get_time(1)]"),
    ("minimax_m2", '<minimax:tool_call><invoke name="get_time"><parameter name="zone">CET'
                   "</parameter></minimax:tool_call>"),
    ("minimax_m2", '<minimax:tool_call><invoke name="get_time"></invoke>oops'
                   "</minimax:tool_call>"),
    ("minimax_m2", '<minimax:tool_call><invoke name="get_time">'),
    ("seed_oss", "<seed:tool_call>\n<function=get_time>\n<parameter=zone>CET</parameter>\n"
                 "</seed:tool_call>"),
]


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
def test_whole_and_streamed(name, reply, content, calls):
    got_content, got_calls = get_tool_parser(name)(TOOLS).extract(reply)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in got_calls] == calls
    for size in (1, 2, 5, 13):
        streamed_content, streamed = _stream(name, reply, size)
        assert streamed_content == (content or "")
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == calls
        # the streamed arguments are the whole reply's, character for character
        assert [c["arguments"] for c in streamed.values()] == \
            [c["function"]["arguments"] for c in got_calls]


@pytest.mark.parametrize(("name", "reply"), [(n, r) for n, r, _, c in CASES if c])
def test_cut_anywhere(name, reply):
    """Every prefix of each reply, as one cut off by max_tokens, streamed 1 and 4 at a time."""
    parse = get_tool_parser(name)(TOOLS).parse
    for size in (1, 4):
        for end in range(len(reply) + 1):
            _check_end(parse, reply[:end], size)


@pytest.mark.parametrize(("name", "reply"), MALFORMED)
def test_malformed_is_content(name, reply):
    """Whole, all text; streamed, all text where no call went out before the fault (else
    the calls sent get their arguments as far as written, and no content)."""
    parse = get_tool_parser(name)(TOOLS).parse
    assert get_tool_parser(name)(TOOLS).extract(reply) == (reply, [])
    for size in (1, 3, 64):
        _check_end(parse, reply, size)


def test_partial_markers_are_held_back():
    streamer = ToolCallStreamer(get_tool_parser("deepseek_v31")(TOOLS).parse)
    assert streamer.feed("Hi <｜tool▁ca", False) == ("Hi ", [])
    assert streamer.feed("lls▁begin｜>", False) == ("", [])
    streamer = ToolCallStreamer(get_tool_parser("glm45")(TOOLS).parse)
    assert streamer.feed("a <tool", False) == ("a ", [])
    assert streamer.feed("box>", True) == ("<toolbox>", [])


@pytest.mark.parametrize("name", ["glm45", "glm47", "deepseek_v3", "deepseek_v31", "granite",
                                  "seed_oss", "minimax_m2"])
def test_markers_survive_detokenization(name):
    """The markers are special tokens in these tokenizers: the server must keep them."""
    assert get_tool_parser(name).skip_special_tokens is False
