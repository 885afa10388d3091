"""LongCat-Flash calls: Hermes' JSON objects {"name": ..., "arguments": {...}}, each in a
<longcat_tool_call>...</longcat_tool_call> block; content is the text before the first."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.hermes import HermesToolParser


class LongcatFlashToolParser(HermesToolParser):
    """`<longcat_tool_call>{"name": "f", "arguments": {...}}</longcat_tool_call>`."""

    name = "longcat"
    start, end = "<longcat_tool_call>", "</longcat_tool_call>"
