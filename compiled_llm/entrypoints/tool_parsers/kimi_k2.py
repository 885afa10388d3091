"""Kimi K2 calls in a <|tool_calls_section_begin|>...<|tool_calls_section_end|> section, each
<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{JSON}<|tool_call_end|>; the
name is the header's part before ":N", without "functions.". Arguments stream as written."""

from __future__ import annotations

import re

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    section_calls,
)
from compiled_llm.entrypoints.tool_parsers.deepseek import json_arguments

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, CALL_END, ARGS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
MARKERS = (SECTION, SECTION_END, CALL, CALL_END)  # section, then call: start, end
_HEADER = re.compile(r"\s*(.+):\d+\s*", re.DOTALL)


class KimiK2ToolParser(ToolParser):
    """`<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
    <|tool_call_argument_begin|>{"x": 1}<|tool_call_end|><|tool_calls_section_end|>`."""

    name = "kimi_k2"
    skip_special_tokens = False  # the markers are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the section, then each call block's call."""
        parsed, done = section_calls(text, final, MARKERS, self._call)
        if done is not None:
            parsed.failed |= final and (not parsed.calls or not parsed.calls[-1].complete)
        return parsed

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until its header is complete); ValueError when it does
        not parse."""
        header, sep, raw = body.partition(ARGS)
        if not sep:
            if closed:
                raise ValueError("a Kimi K2 call without <|tool_call_argument_begin|>")
            return None
        match = _HEADER.fullmatch(header)
        if match is None:
            raise ValueError("a Kimi K2 call's header is functions.NAME:N")
        name = match.group(1).split(":")[0].strip().removeprefix("functions.")
        if not name:
            raise ValueError("a Kimi K2 call needs a function name")
        if closed and not raw.strip():
            return ParsedCall(name, "{}", complete=True)
        arguments, whole = json_arguments(raw, closed)
        if closed and raw.strip()[len(arguments):]:
            raise ValueError("text after a Kimi K2 call's arguments")
        return ParsedCall(name, arguments, complete=closed and whole)
