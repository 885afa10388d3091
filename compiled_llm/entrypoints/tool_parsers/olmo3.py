"""Olmo 3 calls: <function_calls> then one pythonic call a line, f(a=1, b="x"), values Python
or JSON literals (true, false, null), then </function_calls>; a reply that does not open with
the tag is content. Each call's arguments go out whole once its line ends."""

from __future__ import annotations

import ast
import json
import re

from compiled_llm.entrypoints.tool_parsers.base import ParsedCall, ParsedText, ToolParser

START, END = "<function_calls>", "</function_calls>"
_NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class Olmo3ToolParser(ToolParser):
    """`<function_calls>\\nget_weather(city="Paris")\\nget_time(zone="CET")\\n
    </function_calls>`."""

    name = "olmo3"

    def parse(self, text: str, final: bool) -> ParsedText:
        """All content, or (when the reply opens with <function_calls>) all calls."""
        stripped = text.lstrip()
        if not final and START.startswith(stripped):
            return ParsedText()
        if not stripped.startswith(START):
            return ParsedText(text)
        inner, closed, _ = stripped[len(START):].partition(END)
        lines = inner.split("\n")
        done, rest = (lines, "") if closed else (lines[:-1], lines[-1])
        parsed = ParsedText()
        for line in filter(str.strip, done):
            try:
                parsed.calls.append(_call(line))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                parsed.failed = final  # the calls before the fault, as far as they went
                return parsed
        if (match := _NAME.match(rest)) is not None:
            parsed.calls.append(ParsedCall(match.group(1)))
        parsed.failed = final and (not closed or not parsed.calls)
        return parsed


def _call(line: str) -> ParsedCall:
    """One complete `name(key=literal, ...)` line as a call with JSON arguments."""
    node = ast.parse(line.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args \
            or any(k.arg is None for k in node.keywords):
        raise ValueError("an Olmo 3 tool call is name(key=value, ...)")
    arguments = {k.arg: ast.literal_eval(_JsonNames().visit(k.value)) for k in node.keywords}
    return ParsedCall(node.func.id, json.dumps(arguments, ensure_ascii=False), True)


class _JsonNames(ast.NodeTransformer):
    """Reads the JSON literals true, false and null as Python's."""

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 (ast's visitor name)
        """The constant a JSON literal name stands for; other names stay (and fail)."""
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node
