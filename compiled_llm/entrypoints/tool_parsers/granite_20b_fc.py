"""Granite-20B-FunctionCalling calls: each a JSON object {"name": ..., "arguments": {...}}
after a <function_call> tag; content is the text before the first tag."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser, before_marker
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls

TAG = "<function_call>"


class Granite20bFCToolParser(ToolParser):
    """`<function_call> {"name": "f", "arguments": {...}} <function_call> {...}`."""

    name = "granite-20b-fc"

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first <function_call>, then the calls the tags separate."""
        parsed, first = before_marker(text, TAG, final)
        if first < 0:
            return parsed
        try:
            parsed.calls, _ = scan_calls(text, first + len(TAG), final, separator=TAG,
                                         argument_keys=("arguments",))
        except ValueError:
            parsed.failed = final
        parsed.failed |= final and not parsed.calls
        return parsed
