"""Hunyuan-A13B calls: <tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>; a
block inside a <think>...</think> span is not a call (vLLM's reading); content is the text
before the block."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser, holdback
from compiled_llm.entrypoints.tool_parsers.json_scan import list_calls, skip_ws

START, END = "<tool_calls>", "</tool_calls>"
THINK, THINK_END = "<think>", "</think>"


class HunyuanA13BToolParser(ToolParser):
    """`<tool_calls>[{"name": "f", "arguments": {"x": 1}}]</tool_calls>`."""

    name = "hunyuan_a13b"

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first block outside a thinking span, then its calls."""
        first = self._block_start(text)
        if first < 0:
            return ParsedText(text if final else holdback(text, START))
        parsed = ParsedText(text[:first])
        pos = skip_ws(text, first + len(START))
        if pos >= len(text) or text[pos] != "[":
            parsed.failed = final
            return parsed
        end = list_calls(parsed, text, pos, final)
        # the block must hold only the list, and close
        parsed.failed |= final and end is not None and not text.startswith(END, skip_ws(text, end))
        return parsed

    @staticmethod
    def _block_start(text: str) -> int:
        """Where the first <tool_calls> outside a thinking span starts (-1 when none)."""
        return _outside_thinking(text)


def _outside_thinking(text: str) -> int:
    """Where the first <tool_calls> outside a thinking span starts (-1 when none)."""
    pos = 0
    while (start := text.find(START, pos)) >= 0:
        think = text.find(THINK, pos, start)
        if think < 0:
            return start
        pos = text.find(THINK_END, think)
        if pos < 0:
            return -1
    return -1
