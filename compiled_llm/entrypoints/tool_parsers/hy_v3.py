"""Hunyuan (HY) v3 calls: <tool_calls><tool_call>NAME<tool_sep><arg_key>K</arg_key>
<arg_value>V</arg_value>...</tool_call>...</tool_calls>; each value typed by the tool's schema
(a parameter the schema does not type is a string). Arguments stream one pair at a time."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    before_marker,
    loose_value,
    read_blocks,
)

CALLS, CALL, CALL_END, SEP = "<tool_calls>", "<tool_call>", "</tool_call>", "<tool_sep>"
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string",
            "enum": "string", "bool": "boolean", "binary": "boolean", "int": "integer",
            "float": "number", "double": "number", "list": "array", "dict": "object",
            "map": "object"}


def _kind(name: str) -> str:
    """A schema type name as JSON Schema spells it (vLLM's aliases and prefixes)."""
    if name in _ALIASES:
        return _ALIASES[name]
    lower = name.lower()
    if lower.startswith(("int", "uint", "long", "short", "unsigned")):
        return "integer"
    return "number" if lower.startswith(("num", "float")) else name


class HYV3ToolParser(ToolParser):
    """`<tool_calls><tool_call>f<tool_sep><arg_key>x</arg_key><arg_value>1</arg_value>
    </tool_call></tool_calls>`."""

    name = "hy_v3"
    skip_special_tokens = False  # the tags are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before <tool_calls>, then each <tool_call> block's call."""
        parsed, first = before_marker(text, CALLS, final)
        if first < 0:
            return parsed
        whole = read_blocks(text[first:].split(CALL)[1:], CALL_END, self._call, parsed)
        parsed.failed |= final and (not whole or not parsed.calls)
        return parsed

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until <tool_sep> ends its name); ValueError for a closed
        block that does not parse."""
        name, sep, rest = body.partition(SEP)
        if not sep:
            if closed:
                raise ValueError("a HY tool call without <tool_sep>")
            return None
        name = name.strip()
        if not name or "<" in name:
            raise ValueError("a HY tool call needs a function name")
        members, pos = [], 0
        while match := _PAIR.match(rest, pos):
            key = match.group(1)
            value = self._typed(name, key, match.group(2))
            members.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            pos = match.end()
        if closed and rest[pos:].strip():
            raise ValueError("text in a HY tool call that is not a key/value pair")
        return ParsedCall(name, "{" + ", ".join(members) + ("}" if closed else ""), closed)

    def _typed(self, function: str, key: str, raw: str) -> Any:
        """raw as the schema's types allow, tried in vLLM's order: boolean, integer, number,
        other JSON, string; untyped, read as JSON or a Python literal."""
        kind = self.param_type(function, key, default="string")
        kinds = {_kind(k) for k in (kind if isinstance(kind, list) else [kind])} - {"null"}
        if "boolean" in kinds and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        for wanted, read in (("integer", int), ("number", _number)):
            if wanted in kinds:
                try:
                    return read(raw)
                except ValueError:
                    pass
        if kinds - {"string", "boolean", "integer", "number"}:
            try:
                return json.loads(raw)
            except ValueError:
                pass
        return raw if "string" in kinds else loose_value(raw)


def _number(raw: str) -> int | float:
    """raw as a float where it has a point or an exponent, else as an int."""
    return float(raw) if any(c in raw for c in ".eE") else int(raw)
