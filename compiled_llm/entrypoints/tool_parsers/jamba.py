"""Jamba calls: <tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>, the layout
Hunyuan-A13B writes (without its thinking span); content is the text before the block."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.hunyuan_a13b import START, HunyuanA13BToolParser


class JambaToolParser(HunyuanA13BToolParser):
    """`<tool_calls>[{"name": "f", "arguments": {"x": 1}}]</tool_calls>`."""

    name = "jamba"
    skip_special_tokens = False  # the tags are special tokens in Jamba's tokenizer

    @staticmethod
    def _block_start(text: str) -> int:
        """Where the first <tool_calls> starts (-1 when none)."""
        return text.find(START)
