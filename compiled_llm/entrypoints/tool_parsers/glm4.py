"""GLM-4.5 / 4.6 / 4.7 XML calls: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
...</tool_call> (4.5 and 4.6 put a newline after the name and between the tags; 4.7 none);
each value typed by the tool's parameter schema. Arguments stream one pair at a time."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    loose_value,
    tagged_calls,
)

START, END = "<tool_call>", "</tool_call>"
KEY = "<arg_key>"
# one key/value pair; GLM-4.7 sometimes writes a literal "\n" between the tags
_PAIR = re.compile(r"(?:\s|\\n)*<arg_key>(.*?)</arg_key>(?:\s|\\n)*<arg_value>(.*?)</arg_value>",
                   re.DOTALL)
_TRAILING = re.compile(r"(?:\s|\\n)*")


class Glm4ToolParser(ToolParser):
    """`<tool_call>f\\n<arg_key>x</arg_key>\\n<arg_value>1</arg_value>\\n</tool_call>`."""

    name = "glm45"
    skip_special_tokens = False  # the tags are special tokens in GLM's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first <tool_call>, then each block's call."""
        return tagged_calls(text, final, START, END, self._call)

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """The call in one block's body; None until its name is complete; ValueError for a
        closed block that does not parse."""
        lead = len(body) - len(body.lstrip())
        ends = [i for i in (body.find("\n", lead), body.find(KEY, lead)) if i >= 0]
        if not ends and not closed:
            return None
        cut = min(ends) if ends else len(body)
        name = body[:cut].strip()
        if not name or "<" in name:
            raise ValueError("a GLM tool call needs a function name")
        members, pos = [], cut
        while match := _PAIR.match(body, pos):
            key = match.group(1).strip()
            value = self._typed(name, key, match.group(2))
            members.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            pos = match.end()
        if closed and _TRAILING.match(body, pos).end() != len(body):
            raise ValueError("text in a GLM tool call that is not a key/value pair")
        arguments = "{" + ", ".join(members) + ("}" if closed else "")
        return ParsedCall(name, arguments, complete=closed)

    def _typed(self, function: str, key: str, raw: str) -> Any:
        """raw as is for a string parameter; else read as JSON (or a Python literal), raw
        when neither parses (vLLM's reading)."""
        return raw if self.is_string_param(function, key) else loose_value(raw.strip())
