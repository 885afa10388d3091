"""Phi-4-mini calls: functools[{"name": ..., "arguments": {...}}, ...]; content is the text
before functools[ (vLLM drops it; we keep it, as for every other format)."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser, before_marker
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls

BOT = "functools["


class Phi4MiniJsonToolParser(ToolParser):
    """`functools[{"name": "f", "arguments": {...}}, ...]`."""

    name = "phi4_mini_json"

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before functools[, then the list's calls (text after the list ignored,
        as vLLM ignores it)."""
        parsed, first = before_marker(text, BOT, final)
        if first < 0:
            return parsed
        try:
            parsed.calls, _ = scan_calls(text, first + len(BOT), final, closer="]")
        except ValueError:
            parsed.failed = final
        parsed.failed |= final and not parsed.calls
        return parsed
