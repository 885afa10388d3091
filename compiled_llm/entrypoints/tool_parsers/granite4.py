"""Granite 4 calls: a JSON object {"name": ..., "arguments": {...}} in each
<tool_call>...</tool_call> block; the text around and between the blocks is all content (as
vLLM joins it), and a block left open makes the whole reply content."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, holdback
from compiled_llm.entrypoints.tool_parsers.hermes import HermesToolParser


class Granite4ToolParser(HermesToolParser):
    """`Sure.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> Done.`."""

    name = "granite4"
    skip_special_tokens = False  # the tags are special tokens in some Granite 4 tokenizers

    def parse(self, text: str, final: bool) -> ParsedText:
        """Hermes' reading, the text between and after the blocks added to the content; an
        open block fails a final parse."""
        parsed = super().parse(text, final)
        parsed.failed |= final and text.rfind(self.start) > text.rfind(self.end)
        return parsed

    def _between(self, text: str, pos: int, final: bool, parsed: ParsedText) -> int:
        """Where the next block starts (-1 when none); the text up to it is content."""
        start = text.find(self.start, pos)
        if start >= 0:
            parsed.content += text[pos:start]
        else:
            parsed.content += text[pos:] if final else holdback(text[pos:], self.start)
        return start
