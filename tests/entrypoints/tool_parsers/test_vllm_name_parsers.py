"""The parsers for more of vLLM's --tool-call-parser names (Gemma 4, Apertus, HY v3,
Hunyuan-A13B, ERNIE 4.5, Olmo 3, ... and vLLM's aliases) on replies in each family's format:
whole, streamed in small pieces, cut off anywhere, several calls, schema-typed arguments,
content before the calls and malformed calls kept as text."""

from __future__ import annotations

import json

import pytest

from compiled_llm.entrypoints.tool_parsers import TOOL_PARSERS, get_tool_parser
from tests.entrypoints.tool_parsers.test_streamed_ends import _check_end
from tests.entrypoints.tool_parsers.test_tool_parsers import TIME, TOOLS, WEATHER, _stream

Q = '<|"|>'
G_WEATHER = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
G_TIME = f"<|tool_call>call:get_time{{zone:{Q}CET{Q}}}<tool_call|>"
HY_WEATHER = ("<tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>Paris"
              "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
HY_TIME = ("<tool_call>get_time<tool_sep><arg_key>zone</arg_key><arg_value>CET</arg_value>"
           "</tool_call>")
KB, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KC, KA, KX = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
S_B, S_E = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
S_C, S_X, S_S = "<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>"
INV, PAR = '<steptml:invoke name="{}">', '<steptml:parameter name="{}">{}</steptml:parameter>'
S_WEATHER = (f"{S_C}function{S_S}{INV.format('get_weather')}{PAR.format('city', ' Paris ')}"
             f"{PAR.format('days', '3')}</steptml:invoke>{S_X}")
S_TIME = f"{S_C}function{S_S}{INV.format('get_time')}{PAR.format('zone', 'CET')}{S_X}"
JSON_CALLS = ('[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
              '{"name": "get_time", "arguments": {"zone": "CET"}}]')

# (parser, reply, expected content (whitespace kept, as streamed), expected calls)
CASES = [
    ("llama4_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                    '{"name": "get_time", "parameters": {"zone": "CET"}}', None,
     [WEATHER, TIME]),
    ("qwen3_xml", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                  "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "Sure.\n", [WEATHER]),
    ("mimo", "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n"
             "</function>\n</tool_call>", None, [TIME]),
    ("gemma4", f"Let me check.{G_WEATHER}{G_TIME}", "Let me check.", [WEATHER, TIME]),
    # a bare value types by the schema; nested values; a string may hold "," and "}"
    ("gemma4", f"Ok. <|tool_call>call:get_weather{{city:3,"
               f"units:{Q}a,b}}{Q},days:-2,extra:{{k:[1,{Q}x{Q},true,null]}}}}<tool_call|>",
     "Ok. ", [("get_weather", {"city": "3", "units": "a,b}", "days": -2,
                               "extra": {"k": [1, "x", True, None]}})]),
    ("gemma4", "<|tool_call>call:get_time{}<tool_call|>", None, [("get_time", {})]),
    ("gemma4", "No tools: {a:1}.", "No tools: {a:1}.", []),
    ("apertus", 'Checking. <|tools_prefix|>[{"get_weather": {"city": "Paris", "days": 3}}, '
                '{"get_time": {"zone": "CET"}}]<|tools_suffix|>', "Checking. ",
     [WEATHER, TIME]),
    ("apertus", '<|tools_prefix|>[{"get_time": {"zone": "CET"}}]', None, [TIME]),
    ("apertus", "[1] is a list.", "[1] is a list.", []),
    ("hy_v3", f"Looking.\n<tool_calls>{HY_WEATHER}\n{HY_TIME}</tool_calls>", "Looking.\n",
     [WEATHER, TIME]),
    # a string (and an untyped) parameter stays a string; an integer is read as one
    ("hy_v3", "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>"
              "3</arg_value><arg_key>days</arg_key><arg_value>7</arg_value><arg_key>x"
              "</arg_key><arg_value>[1]</arg_value></tool_call></tool_calls>", None,
     [("get_weather", {"city": "3", "days": 7, "x": "[1]"})]),
    ("hunyuan_a13b", f"Sure.<tool_calls>{JSON_CALLS}</tool_calls>", "Sure.", [WEATHER, TIME]),
    # a block inside the thinking span is not a call
    ("hunyuan_a13b", '<think>maybe <tool_calls>[{"name": "get_time", "arguments": {}}]'
                     f"</tool_calls></think>\n<tool_calls>{JSON_CALLS}</tool_calls>",
     '<think>maybe <tool_calls>[{"name": "get_time", "arguments": {}}]</tool_calls></think>\n',
     [WEATHER, TIME]),
    ("ernie45", 'Hmm.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
                '{"zone": "CET"}}\n</tool_call>\n', "Hmm.\n", [WEATHER, TIME]),
    ("olmo3", '<function_calls>\nget_weather(city="Paris", days=3)\nget_time(zone=\'CET\')\n'
              "</function_calls>", None, [WEATHER, TIME]),
    ("olmo3", "<function_calls>get_weather(city=null, days=true)</function_calls>", None,
     [("get_weather", {"city": None, "days": True})]),
    ("olmo3", "The <b> tag.", "The <b> tag.", []),
    ("kimi_k2", f"Let me look.{KB}{KC}functions.get_weather:0{KA}"
                '{"city": "Paris", "days": 3}' f"{KX}{KC}functions.get_time:1{KA}"
                '{"zone": "CET"}' f"{KX}{KE}", "Let me look.", [WEATHER, TIME]),
    ("kimi_k2", f"{KB}{KC}get_time:0{KA}{KX}{KE}", None, [("get_time", {})]),
    ("longcat", 'Ok.<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Paris",'
                ' "days": 3}}</longcat_tool_call><longcat_tool_call>{"name": "get_time", '
                '"arguments": {"zone": "CET"}}</longcat_tool_call>', "Ok.", [WEATHER, TIME]),
    ("internlm", 'Sure.<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": '
                 '{"city": "Paris", "days": 3}}<|action_end|>', "Sure.", [WEATHER]),
    ("jamba", f"Hi. <tool_calls>{JSON_CALLS}</tool_calls>", "Hi. ", [WEATHER, TIME]),
    ("xlam", JSON_CALLS, None, [WEATHER, TIME]),
    ("xlam", f"Here:\n```json\n{JSON_CALLS}\n```", "Here:\n", [WEATHER, TIME]),
    ("xlam", f"[TOOL_CALLS]{JSON_CALLS}", None, [WEATHER, TIME]),
    ("xlam", "```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    # Granite 4: the text around and between the calls is content
    ("granite4", 'A <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": '
                 '3}}</tool_call> B <tool_call>{"name": "get_time", "arguments": {"zone": '
                 '"CET"}}</tool_call> C', "A  B  C", [WEATHER, TIME]),
    ("granite-20b-fc", '<function_call> {"name": "get_weather", "arguments": {"city": '
                       '"Paris", "days": 3}} <function_call> {"name": "get_time", '
                       '"arguments": {"zone": "CET"}}', None, [WEATHER, TIME]),
    ("step3", f"Checking.{S_B}{S_WEATHER}{S_TIME}{S_E}", "Checking.", [WEATHER, TIME]),
]

# replies whose calls do not parse: all of the text is content, no calls
MALFORMED = [
    ("gemma4", f"<|tool_call>call:get_time{{zone:{Q}CET{Q}<tool_call|>"),
    ("gemma4", f"<|tool_call>call:get_time{{zone:{Q}CET{Q}}} junk<tool_call|>"),
    ("gemma4", "<|tool_call>get_time()<tool_call|>"),
    ("gemma4", f"{G_WEATHER}<|tool_call>call:get_time{{zone:{Q}CE"),
    ("apertus", '<|tools_prefix|>[{"get_time": {"zone": "CET"}, "x": 1}]<|tools_suffix|>'),
    ("apertus", '<|tools_prefix|>[{"get_time": "CET"}]<|tools_suffix|>'),
    ("apertus", '<|tools_prefix|>[{"get_time": {"zone": "CET"}}'),
    ("hy_v3", f"<tool_calls>{HY_WEATHER}<tool_call>get_time<arg_key>zone</arg_key>"
              "<arg_value>CET</arg_value></tool_call></tool_calls>"),
    ("hy_v3", "<tool_calls><tool_call>get_time<tool_sep>junk</tool_call></tool_calls>"),
    ("hunyuan_a13b", f"<tool_calls>{JSON_CALLS} and more</tool_calls>"),
    ("hunyuan_a13b", f"<tool_calls>{JSON_CALLS}"),
    ("ernie45", '<tool_call>\nget_time(zone="CET")\n</tool_call>'),
    ("ernie45", '<tool_call>\n{"name": "get_time", "arguments": {"zone": CET}}\n</tool_call>'),
    ("olmo3", "<function_calls>\nget_time(zone=CET)\n</function_calls>"),
    ("olmo3", '<function_calls>\nget_time(zone="CET")\n'),
    ("kimi_k2", f"{KB}{KC}get_time{KA}" '{"zone": "CET"}' f"{KX}{KE}"),
    ("kimi_k2", f"{KB}{KC}functions.get_time:0{KA}" '{"zone": "CET"} x' f"{KX}{KE}"),
    ("longcat", '<longcat_tool_call>{"name": "get_time"} x</longcat_tool_call>'),
    ("internlm", '<|action_start|><|plugin|>{"name": "get_time"} x<|action_end|>'),
    ("jamba", f"<tool_calls>{JSON_CALLS} x</tool_calls>"),
    ("xlam", "[1, 2]"),
    ("granite4", '<tool_call>{"name": "get_time", "arguments": {}}'),
    ("granite-20b-fc", '<function_call> {"name": "get_time", "arguments": {}} oops'),
    ("step3", f"{S_B}{S_TIME}"),
    ("step3", f"{S_B}{S_C}tool{S_S}{INV.format('get_time')}{S_X}{S_E}"),
]

UNFINISHED = {
    "llama4_json": '{"name": "get_weather", "parameters": {"city": "Pa',
    "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
    "mimo": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
    "gemma4": f"<|tool_call>call:get_weather{{city:{Q}Pa",
    "apertus": '<|tools_prefix|>[{"get_weather": {"city": "Pa',
    "hy_v3": "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>Pa",
    "hunyuan_a13b": '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Pa',
    "ernie45": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
    "olmo3": '<function_calls>\nget_weather(city="Pa',
    "kimi_k2": f'{KB}{KC}functions.get_weather:0{KA}{{"city": "Pa',
    "longcat": '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
    "internlm": '<|action_start|><|plugin|>{"name": "get_weather", "parameters": {"city": "P',
    "jamba": '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Pa',
    "xlam": '[{"name": "get_weather", "arguments": {"city": "Pa',
    "granite4": '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
    "granite-20b-fc": '<function_call> {"name": "get_weather", "arguments": {"city": "Pa',
    "step3": f"{S_B}{S_C}function{S_S}{INV.format('get_weather')}{PAR.format('city', 'P')}",
}


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
def test_whole_and_streamed(name, reply, content, calls):
    got_content, got_calls = get_tool_parser(name)(TOOLS).extract(reply)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in got_calls] == calls
    for size in (1, 3, 7):
        streamed_content, streamed = _stream(name, reply, size)
        assert streamed_content == (content or "")
        # the streamed arguments are the whole reply's, character for character
        assert [(c["name"], c["arguments"]) for c in streamed.values()] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls]


@pytest.mark.parametrize(("name", "reply"), [(n, r) for n, r, _, c in CASES if c])
def test_cut_anywhere(name, reply):
    """Every prefix of each reply, as one cut off by max_tokens, streamed 1 and 4 at a time."""
    parse = get_tool_parser(name)(TOOLS).parse
    for size in (1, 4):
        for end in range(len(reply) + 1):
            _check_end(parse, reply[:end], size)


@pytest.mark.parametrize(("name", "reply"), MALFORMED + sorted(UNFINISHED.items()))
def test_malformed_is_content(name, reply):
    """Whole, all text; streamed, all text where no call went out before the fault (else
    the calls sent get their arguments as far as written, and no content)."""
    parse = get_tool_parser(name)(TOOLS).parse
    assert get_tool_parser(name)(TOOLS).extract(reply) == (reply, [])
    for size in (1, 3, 64):
        _check_end(parse, reply, size)


def test_aliases_are_vllms():
    """vLLM maps these names onto the same parser as ours."""
    assert TOOL_PARSERS["llama4_json"] == TOOL_PARSERS["llama3_json"]
    assert TOOL_PARSERS["qwen3_xml"] == TOOL_PARSERS["mimo"] == TOOL_PARSERS["qwen3_coder"]


@pytest.mark.parametrize("name", ["gemma4", "apertus", "hy_v3", "kimi_k2", "internlm",
                                  "jamba", "granite4", "step3"])
def test_markers_survive_detokenization(name):
    """The markers are special tokens in these tokenizers: the server must keep them."""
    assert get_tool_parser(name).skip_special_tokens is False
