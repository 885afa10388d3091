"""Hermes-style calls (Qwen2.5, Qwen3, Hermes, many fine-tunes): each call a JSON object
{"name": ..., "arguments": {...}} inside <tool_call>...</tool_call>; content is the text
before the first call."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser, before_marker
from compiled_llm.entrypoints.tool_parsers.json_scan import call_from_object, skip_ws

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    """`<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, one block per call."""

    name = "hermes"

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first <tool_call>, then each block's call."""
        parsed, first = before_marker(text, START, final)
        if first < 0:
            return parsed
        pos = first
        try:
            while pos >= 0:
                pos = self._block(text, pos + len(START), final, parsed)
                pos = -1 if pos is None else text.find(START, pos)
        except ValueError:
            parsed.failed = final
        return parsed

    @staticmethod
    def _block(text: str, pos: int, final: bool, parsed: ParsedText) -> int | None:
        """Parse the block whose body starts at pos into parsed; where it ends (None while
        open)."""
        end = text.find(END, pos)
        body = text[:end] if end >= 0 else text
        pos = skip_ws(body, pos)
        if pos >= len(body):
            if end >= 0 or final:
                raise ValueError("empty <tool_call> block")
            return None
        call, _ = call_from_object(body, pos, final or end >= 0)
        if call is not None:
            parsed.calls.append(call)
        return None if end < 0 else end + len(END)
