"""Llama 4 pythonic calls: the pythonic list, [f(a=1), g(b="x")], which Llama 4 sometimes
wraps in <|python_start|> ... <|python_end|> (the tags are dropped before parsing)."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText
from compiled_llm.entrypoints.tool_parsers.pythonic import PythonicToolParser

START, END = "<|python_start|>", "<|python_end|>"


class Llama4PythonicToolParser(PythonicToolParser):
    """`[get_weather(city="Paris")]`, or the same inside <|python_start|>...<|python_end|>."""

    name = "llama4_pythonic"

    def parse(self, text: str, final: bool) -> ParsedText:
        """The pythonic reading of text without its tags; a reply that is no list is all
        content, tags and all."""
        if not final and START.startswith(text.lstrip()):
            return ParsedText()
        inner = text.lstrip()
        if not inner.startswith(START):
            return super().parse(text, final)
        parsed = super().parse(inner[len(START):].replace(END, ""), final)
        if not parsed.calls and not parsed.failed and parsed.content:
            return ParsedText(text)
        return parsed
