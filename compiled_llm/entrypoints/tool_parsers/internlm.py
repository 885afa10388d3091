"""InternLM2 calls: one call a reply, <|action_start|><|plugin|> then a JSON object
{"name": ..., "parameters": {...}} ("arguments" also read), then <|action_end|>; content is
the text before the call."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    before_marker,
    holdback,
)
from compiled_llm.entrypoints.tool_parsers.json_scan import call_from_object, skip_ws

START, END = "<|action_start|><|plugin|>", "<|action_end|>"
KEYS = ("parameters", "arguments")


class Internlm2ToolParser(ToolParser):
    """`<|action_start|><|plugin|>\\n{"name": "f", "parameters": {"x": 1}}<|action_end|>`."""

    name = "internlm"
    skip_special_tokens = False  # the action tags are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the call, then the call."""
        parsed, first = before_marker(text, START, final)
        if first < 0:
            return parsed
        body, closed, _ = text[first + len(START):].partition(END)
        whole = final or bool(closed)
        body = body if whole else holdback(body, END)  # a partial end tag is no argument
        pos = skip_ws(body, 0)
        try:
            if pos >= len(body):
                raise ValueError("no call after <|action_start|><|plugin|>")
            call, end = call_from_object(body, pos, whole, KEYS)
        except ValueError:
            parsed.failed = whole
            if pos < len(body) and whole:  # the call as far as a streamer sent it
                written = _as_written(body, pos)
                parsed.calls += [written] if written is not None else []
            return parsed
        parsed.calls += [call] if call is not None else []
        if whole and body[end:].strip():  # vLLM reads the call as one JSON value
            call.complete, parsed.failed = False, True
        return parsed


def _as_written(body: str, pos: int) -> ParsedCall | None:
    """The call at pos read as still open (None where even that does not parse)."""
    try:
        return call_from_object(body, pos, False, KEYS)[0]
    except ValueError:
        return None
