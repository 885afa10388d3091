"""Apertus calls: <|tools_prefix|>[{"NAME": {ARGUMENTS}}, ...]<|tools_suffix|>, each call an
object whose one key is the function's name; content is the text before the prefix."""

from __future__ import annotations

import json

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    before_marker,
)
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_object, skip_ws

PREFIX, SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"


class ApertusToolParser(ToolParser):
    """`<|tools_prefix|>[{"f": {"x": 1}}, {"g": {}}]<|tools_suffix|>`."""

    name = "apertus"
    skip_special_tokens = False  # the prefix and suffix are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the prefix, then the list's calls (vLLM reads the list whether or
        not the suffix follows)."""
        parsed, first = before_marker(text, PREFIX, final)
        if first < 0:
            return parsed
        pos = skip_ws(text, first + len(PREFIX))
        if pos >= len(text):
            parsed.failed = final
            return parsed
        try:
            if text[pos] != "[":
                raise ValueError("Apertus calls are a JSON list")
            closed = _calls(text, pos + 1, final, parsed.calls)
        except ValueError:
            parsed.failed = final
            return parsed
        parsed.failed = final and (not closed or not parsed.calls)
        return parsed


def _calls(text: str, pos: int, final: bool, calls: list[ParsedCall]) -> bool:
    """The list's calls from pos into calls; whether the list closed. ValueError where the
    list does not parse (not final, only where written text is wrong)."""
    pos = skip_ws(text, pos)
    while pos < len(text):
        if text[pos] == "]":
            return True
        members, end = scan_object(text, pos, final)
        if not members:
            if end is not None:
                raise ValueError("an Apertus call is an object with one key")
            return False
        name, (start, stop) = next(iter(members.items()))
        if not text.startswith("{", start):
            raise ValueError("an Apertus call's arguments are a JSON object")
        if stop is not None:
            json.loads(text[start:stop])  # a whole object, or ValueError
        calls.append(ParsedCall(name, text[start:stop] if stop else text[start:],
                                complete=end is not None and len(members) == 1))
        if len(members) > 1:  # the call as far as it was streamed, then the fault
            raise ValueError("an Apertus call is an object with one key")
        if end is None:
            return False
        pos = skip_ws(text, end)
        if text.startswith(",", pos):
            pos = skip_ws(text, pos + 1)
        elif pos < len(text) and text[pos] != "]":
            raise ValueError("expected ',' or ']' between Apertus calls")
    return False
