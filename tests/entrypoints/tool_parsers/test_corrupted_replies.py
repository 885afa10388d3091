"""Corrupted replies (a marker mangled, a newline inside a name, a stray bracket) that once
broke the streamed-equals-final invariant: whole they are all text, and streamed the calls that
went out get exactly their arguments as written (DeepSeek V3/V3.1 and Kimi K2 once streamed
a next marker's first characters as arguments; the pythonic list once dropped its earlier
calls at a bad item)."""

from __future__ import annotations

import pytest

from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from tests.entrypoints.tool_parsers.test_streamed_ends import _check_end, _stream
from tests.entrypoints.tool_parsers.test_tool_parsers import TOOLS

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
V3_TIME = f"{CB}function{SEP}get_time\n```json\n" '{"zone": "CET"}\n```' f"{CE}"
KIMI = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
        '<|tool_call_argument_begin|>{"zone": "CET<<|tool_call_end|><|tool_calls_section_end|>')

# (parser, corrupted reply, arguments streamed for each call that goes out)
REPLIES = [
    # the first call's end marker is mangled: its arguments run up to the next call's begin
    ("deepseek_v31", f"{B}{CB}get_time{SEP}" '{"zone" "CET"}<｜tol▁call▁end｜>'
                     f"{CB}get_time{SEP}" '{"zone": "CET"}' f"{CE}{E}",
     ['{"zone" "CET"}<｜tol▁call▁end｜>']),
    # arguments that do not parse end in a partial marker's first character
    ("deepseek_v31", f"{B}{CB}get_time{SEP}" '{"zone": "CET<' f"{CE}{E}", ['{"zone": "CET<']),
    # a newline inside a string; the call's end mangled, the section's end cuts it off
    ("deepseek_v3", f"{B}{CB}function{SEP}get_time\n```json\n" '{"z\none": "CET"}\n```'
                    f"<｜tool▁ca>ll▁end｜>{E}", ['{"z\none": "CET"}\n```<｜tool▁ca>ll▁end｜>']),
    ("deepseek_v3", f"{B}{CB}function{SEP}get_time\n```json\n" '{"zone": "CET}\n```'
                    f"<｜/x>{V3_TIME}{E}", ['{"zone": "CET}\n```<｜/x>']),
    ("kimi_k2", KIMI, ['{"zone": "CET<']),
    # the second item is no call: the first, already sent, keeps its arguments
    ("llama4_pythonic", '<|python_start|>[get_time(zone="CET"), get\n_time(zone=\'CET\')]'
                        "<|python_end|>", ['{"zone": "CET"}']),
    ("llama4_pythonic", '[get_time(zone="CET"), get_t,ime(zone="CET")]', ['{"zone": "CET"}']),
    ("llama4_pythonic", '[get_time(zone="CET"), get_time(zon}e="CET")]', ['{"zone": "CET"}']),
    ("pythonic", '[get_time(zone="CET"), 3]', ['{"zone": "CET"}']),
]


@pytest.mark.parametrize(("name", "reply", "arguments"), REPLIES)
def test_corrupted_reply(name, reply, arguments):
    """Whole: all text, no calls. Streamed 1, 2, 3 and 8 at a time: the calls sent get the
    arguments as written (the invariant), none shrinks, and no content follows them."""
    parser = get_tool_parser(name)(TOOLS)
    assert parser.extract(reply) == (reply, [])
    for size in (1, 2, 3, 8):
        _check_end(parser.parse, reply, size)
        content, calls = _stream(parser.parse, reply, size)
        assert content == "" and [args for _, args in calls] == arguments, (size, calls)
