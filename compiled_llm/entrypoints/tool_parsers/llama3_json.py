"""Llama 3.x JSON calls: the reply is one or more {"name": ..., "parameters": {...}} objects
(separated by ";"), optionally after <|python_tag|>; a reply that starts otherwise is
content."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """`{"name": "f", "parameters": {...}}; {...}` as the whole reply."""

    name = "llama3_json"
    skip_special_tokens = False  # <|python_tag|> is a special token

    def parse(self, text: str, final: bool) -> ParsedText:
        """All content, or (when the reply opens with "{" or the tag) all calls."""
        pos = skip_ws(text, 0)
        rest = text[pos:]
        if not final and (not rest or PYTHON_TAG.startswith(rest)):
            return ParsedText()
        if rest.startswith(PYTHON_TAG):
            pos = skip_ws(text, pos + len(PYTHON_TAG))
        elif not rest.startswith("{"):
            return ParsedText(text)
        try:
            calls, _ = scan_calls(text, pos, final, separator=";")
        except ValueError:
            return ParsedText(failed=final)
        return ParsedText("", calls)
