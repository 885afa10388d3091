"""Qwen3-Coder XML calls: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
</function></tool_call>; each value typed by the tool's parameter schema (a string stays a
string, other types are read as JSON). Arguments stream one parameter at a time."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    as_written,
    before_marker,
    loose_value,
)

START, END = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_FUNCTION_END = "</function>"


class Qwen3CoderToolParser(ToolParser):
    """`<tool_call>\\n<function=f>\\n<parameter=x>\\n1\\n</parameter>\\n</function>\\n</tool_call>`."""

    name = "qwen3_coder"
    start, end = START, END  # the block's tags (Seed-OSS writes the same calls in others)

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first block, then each block's call."""
        parsed, first = before_marker(text, self.start, final)
        if first < 0:
            return parsed
        for block in text[first:].split(self.start)[1:]:
            body, closed, _ = block.partition(self.end)
            call = self._call(body, final or bool(closed))
            if call is None:
                parsed.failed = final or bool(closed)
                # a block closed without </function>: the call as far as it was streamed
                salvaged = as_written(self._call, body) if closed else None
                parsed.calls += [salvaged] if salvaged is not None else []
                break
            parsed.calls.append(call)
            if not call.complete:
                break
        return parsed

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """The call in one block's body; None until the function name is complete."""
        match = _FUNCTION.search(body)
        if match is None:
            return None
        name = match.group(1).strip()
        inner, done, _ = body[match.end():].partition(_FUNCTION_END)
        if closed and not done:
            return None
        members = [f"{json.dumps(key.strip())}: "
                   f"{json.dumps(self._typed(name, key.strip(), value), ensure_ascii=False)}"
                   for key, value in _PARAMETER.findall(inner)]
        arguments = "{" + ", ".join(members) + ("}" if done else "")
        return ParsedCall(name, arguments, complete=bool(done))

    def _typed(self, function: str, key: str, raw: str) -> Any:
        """raw (one leading and trailing newline dropped) as the schema's type says."""
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        return value if self.is_string_param(function, key) else loose_value(value)
