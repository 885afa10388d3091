"""Step-3 calls: <｜tool_calls_begin｜> then <｜tool_call_begin｜>function<｜tool_sep｜>
<steptml:invoke name="NAME"><steptml:parameter name="K">V</steptml:parameter>...
</steptml:invoke><｜tool_call_end｜> per call, then <｜tool_calls_end｜>; each value stripped
and typed by the tool's schema (untyped, a string). Arguments stream one parameter at a time."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    section_calls,
)

CALLS, CALLS_END = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
CALL, CALL_END, SEP = "<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>"
MARKERS = (CALLS, CALLS_END, CALL, CALL_END)  # section, then call: start, end
_INVOKE = re.compile(r'\s*<steptml:invoke name="([^"]+)">')
_PARAMETER = re.compile(r'\s*<steptml:parameter name="([^"]+)">([^<]*)</steptml:parameter>')
_INVOKE_END = re.compile(r"\s*(</steptml:invoke>)?\s*")


class Step3ToolParser(ToolParser):
    """`<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke
    name="f"><steptml:parameter name="x">1</steptml:parameter></steptml:invoke>
    <｜tool_call_end｜><｜tool_calls_end｜>`."""

    name = "step3"
    skip_special_tokens = False  # the markers are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before <｜tool_calls_begin｜>, then each call block's call (the calls
        must end with <｜tool_calls_end｜>, as vLLM reads them)."""
        parsed, done = section_calls(text, final, MARKERS, self._call)
        if done is not None:
            parsed.failed |= final and (not done or not parsed.calls
                                    or not parsed.calls[-1].complete)
        return parsed

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until its invoke tag is complete); ValueError when it does
        not parse."""
        kind, sep, rest = body.partition(SEP)
        invoke = _INVOKE.match(rest) if sep else None
        if invoke is None:
            if closed:
                raise ValueError("a Step-3 call is function<｜tool_sep｜><steptml:invoke ...>")
            return None
        if kind.strip() != "function":
            raise ValueError("a Step-3 call's type must be function")
        name, pos, members = invoke.group(1), invoke.end(), []
        while param := _PARAMETER.match(rest, pos):
            key = param.group(1)
            value = self._typed(name, key, param.group(2).strip())
            members.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            pos = param.end()
        if closed and (_INVOKE_END.fullmatch(rest, pos) is None):
            raise ValueError("text in a Step-3 call that is not a parameter")
        return ParsedCall(name, "{" + ", ".join(members) + ("}" if closed else ""), closed)

    def _typed(self, function: str, key: str, raw: str) -> Any:
        """raw as the schema's type says (vLLM's casts; raw where one fails)."""
        kind = self.param_type(function, key)
        try:
            if kind == "integer":
                return int(raw)
            if kind == "number":
                return float(raw)
        except ValueError:
            return raw
        if kind == "boolean" and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if kind == "null" and raw.lower() == "null":
            return None
        return raw
