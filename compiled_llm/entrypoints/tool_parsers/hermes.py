"""Hermes-style calls (Qwen2.5, Qwen3, Hermes, many fine-tunes): each call a JSON object
{"name": ..., "arguments": {...}} inside <tool_call>...</tool_call>; content is the text
before the first call."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedText,
    ToolParser,
    before_marker,
    holdback,
)
from compiled_llm.entrypoints.tool_parsers.json_scan import call_from_object, skip_ws

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    """`<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, one block per call."""

    name = "hermes"
    start, end = START, END  # the block's tags (LongCat writes the same calls in others)

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first <tool_call>, then each block's call."""
        parsed, first = before_marker(text, self.start, final)
        if first < 0:
            return parsed
        pos = first
        try:
            while pos >= 0:
                pos = self._block(text, pos + len(self.start), final, parsed)
                pos = -1 if pos is None else self._between(text, pos, final, parsed)
        except ValueError:
            parsed.failed = final
        return parsed

    def _between(self, text: str, pos: int, final: bool, parsed: ParsedText) -> int:
        """Where the next block after pos starts (-1 when none); the text between is not
        content (vLLM's reading)."""
        return text.find(self.start, pos)

    def _block(self, text: str, pos: int, final: bool, parsed: ParsedText) -> int | None:
        """Parse the block whose body starts at pos into parsed; where it ends (None while
        open)."""
        end = text.find(self.end, pos)
        # while open, a partial end tag is not yet the call's text
        body = text[:end] if end >= 0 else text if final else holdback(text, self.end)
        pos = skip_ws(body, pos)
        if pos >= len(body):
            if end >= 0 or final:
                raise ValueError(f"empty {self.start} block")
            return None
        try:
            call, object_end = call_from_object(body, pos, final or end >= 0)
        except ValueError:
            written, _ = call_from_object(body, pos, False)  # what a streamer sent of it
            parsed.calls += [written] if written is not None else []
            raise
        if call is not None:
            parsed.calls.append(call)
        if end >= 0 and body[object_end:].strip():  # vLLM reads the block as one JSON value
            call.complete = False  # as far as it was streamed
            raise ValueError(f"text after the call's object in a {self.start} block")
        return None if end < 0 else end + len(self.end)
