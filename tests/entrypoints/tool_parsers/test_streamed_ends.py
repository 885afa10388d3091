"""How a streamed reply ends agrees with the same text read whole: a reply cut off anywhere
(max_tokens) or ending in text the format does not allow streams calls whose argument deltas
add up to each call's final arguments (as extract reads them, or as far as they are written
where extract finds no calls), never a call with empty arguments, and, where no call went out,
the whole text as content."""

from __future__ import annotations

import json

import pytest

from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from compiled_llm.entrypoints.tool_parsers.base import ToolCallStreamer, extract
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls
from tests.entrypoints.tool_parsers.test_tool_parsers import CASES, TOOLS

REQUIRED = ('[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, '
            '{"name": "get_time", "parameters": {"zone": "CET"}}]')
CALL_CASES = [(name, reply) for name, reply, _, calls in CASES if calls]


def _stream(parse, text: str, size: int) -> tuple[str, list[tuple[str, str]]]:
    """text fed `size` characters at a time, the last piece final: content and calls."""
    streamer, content, calls = ToolCallStreamer(parse), "", []
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    for i, piece in enumerate(pieces):
        delta, deltas = streamer.feed(piece, final=i == len(pieces) - 1)
        content += delta
        for d in deltas:
            if d["index"] == len(calls):
                calls.append((d["function"]["name"], ""))
            name, arguments = calls[d["index"]]
            calls[d["index"]] = (name, arguments + d["function"]["arguments"])
    return content, calls


def _check_end(parse, text: str, size: int) -> None:
    content, calls = _stream(parse, text, size)
    whole_content, whole_calls = extract(parse, text)
    if whole_calls:
        assert calls == [(c["function"]["name"], c["function"]["arguments"])
                         for c in whole_calls], text
        return
    written = parse(text, False).calls
    assert [args for _, args in calls] == [c.arguments for c in written[:len(calls)]], text
    assert all(args for _, args in calls), text  # no call without arguments
    if not calls:
        assert content == (whole_content or ""), text


@pytest.mark.parametrize("size", [1, 4, 9])
@pytest.mark.parametrize(("name", "reply"), CALL_CASES)
def test_cut_anywhere(name, reply, size):
    """Every prefix of each reply, as a reply cut off by max_tokens."""
    parse = get_tool_parser(name)(TOOLS).parse
    for end in range(len(reply) + 1):
        _check_end(parse, reply[:end], size)


@pytest.mark.parametrize("size", [1, 4, 9])
@pytest.mark.parametrize("mode", ["required", "named"])
def test_forced_calls_cut_anywhere(mode, size):
    plan = ToolPlan(mode, TOOLS, name="get_time" if mode == "named" else None)
    reply = REQUIRED if mode == "required" else '{"zone": "CET"}'
    for end in range(len(reply) + 1):
        _check_end(plan.parse, reply[:end], size)


@pytest.mark.parametrize("junk", ["<|eot_id|>", " x", "; {", "}"])
@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}; '
    '{"name": "get_weather", "parameters": {"city": "Paris"}}'])
def test_llama3_end_that_does_not_parse(body, junk):
    """Text after the calls that the format does not allow (here coming in one delta with
    the end of the arguments, as a server coalesces tokens) fails the final parse; the calls
    already streamed still get all their arguments."""
    parse = get_tool_parser("llama3_json")(TOOLS).parse
    streamer = ToolCallStreamer(parse)
    _, first = streamer.feed(body[:-8], False)
    _, rest = streamer.feed(body[-8:] + junk, True)
    arguments: dict[int, str] = {}
    for d in first + rest:
        arguments[d["index"]] = arguments.get(d["index"], "") + d["function"]["arguments"]
    assert extract(parse, body + junk) == (body + junk, [])
    assert [json.loads(a) for a in arguments.values()] == \
        [json.loads(c["function"]["arguments"]) for c in extract(parse, body)[1]]


def test_required_cut_after_a_name_leaves_no_empty_call():
    """Cut off right after the second call's name: only the first call went out."""
    plan = ToolPlan("required", TOOLS)
    text = REQUIRED[:REQUIRED.index('"get_time"') + len('"get_time", "parameters": ')]
    content, calls = _stream(plan.parse, text, 3)
    assert calls == [("get_weather", '{"city": "Paris", "days": 3}')] and content == ""


def test_named_call_without_arguments_is_an_empty_object():
    plan = ToolPlan("named", TOOLS, name="get_time")
    assert _stream(plan.parse, "", 1) == ("", [("get_time", "{}")])
    assert extract(plan.parse, "")[1][0]["function"]["arguments"] == "{}"


def test_scan_stops_at_bad_json_until_final():
    text = '{"name": "get_time", "parameters": {"zone": "CET"}} oops'
    calls, end = scan_calls(text, 0, False, separator=";")
    assert [(c.name, c.arguments) for c in calls] == [("get_time", '{"zone": "CET"}')]
    assert end is None
    with pytest.raises(ValueError):
        scan_calls(text, 0, True, separator=";")
    inside = '{"name": "get_time", "parameters": {"zone": "CET"} oops'
    [call], _ = scan_calls(inside, 0, False, separator=";")
    assert call.arguments == '{"zone": "CET"}' and not call.complete
