"""MiniMax-M2 XML calls: <minimax:tool_call> blocks of <invoke name="NAME"><parameter
name="KEY">VALUE</parameter>...</invoke>, several invokes to a block; each value typed by the
tool's parameter schema. Arguments stream one parameter at a time."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    before_marker,
)

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_END = "</invoke>"
_INVOKE = re.compile(r"\s*<invoke name=([\"']?)([^\"'>\n]+)\1>")
_PARAMETER = re.compile(r"\s*<parameter name=([\"']?)([^\"'>\n]+)\1>(.*?)</parameter>", re.DOTALL)
_STRING = ("string", "str", "text")


class MinimaxM2ToolParser(ToolParser):
    """`<minimax:tool_call>\\n<invoke name="f">\\n<parameter name="x">1</parameter>\\n
    </invoke>\\n</minimax:tool_call>`."""

    name = "minimax_m2"
    skip_special_tokens = False  # the block tags are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first block, then each block's invokes."""
        parsed, first = before_marker(text, START, final)
        if first < 0:
            return parsed
        for block in text[first:].split(START)[1:]:
            body, closed, _ = block.partition(END)
            pos = 0
            while (match := _INVOKE.match(body, pos)) is not None:
                call, pos = self._invoke(match, body)
                parsed.calls.append(call)
                if not call.complete:
                    parsed.failed = final or bool(closed)
                    return parsed
            rest = body[pos:].strip()
            if closed and rest or final and not closed:
                parsed.failed = True
            if closed and rest or not closed:
                break
        parsed.failed |= final and not parsed.calls
        return parsed

    def _invoke(self, match: re.Match[str], body: str) -> tuple[ParsedCall, int]:
        """The call an <invoke> opens and where its </invoke> ends (incomplete while open)."""
        name, pos, members = match.group(2).strip(), match.end(), []
        while (param := _PARAMETER.match(body, pos)) is not None:
            key = param.group(2).strip()
            value = self._typed(name, key, param.group(3).strip())
            members.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            pos = param.end()
        rest = body[pos:].lstrip()
        done = rest.startswith(INVOKE_END)
        arguments = "{" + ", ".join(members) + ("}" if done else "")
        end = len(body) - len(rest) + len(INVOKE_END) if done else pos
        return ParsedCall(name, arguments, complete=done), end

    def _typed(self, function: str, key: str, raw: str) -> Any:
        """raw as the schema's types say: a string stays a string, "null" is null, other
        types are read as JSON (raw when that fails)."""
        kind = self.param_type(function, key, default="string")
        kinds = kind if isinstance(kind, list) else [kind]
        if raw.lower() in ("null", "none"):
            return None
        if any(k in _STRING for k in kinds) and len(kinds) == 1:
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            return raw
