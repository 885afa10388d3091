"""ERNIE 4.5 calls: Hermes' layout, each call a JSON object {"name": ..., "arguments": {...}}
in a <tool_call>...</tool_call> block; content is the text before the first block."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.hermes import HermesToolParser


class Ernie45ToolParser(HermesToolParser):
    """`<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, one block per call."""

    name = "ernie45"
