"""Pythonic calls (Llama 3.2/4, ToolACE and others): the reply is a Python list of calls,
[f(a=1), g(b="x")], keyword arguments only, values Python literals; each call's arguments
go out as one JSON fragment once the call is complete."""

from __future__ import annotations

import ast
import json
import re

from compiled_llm.entrypoints.tool_parsers.base import ParsedCall, ParsedText, ToolParser

_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_OPEN, _CLOSE = "([{", ")]}"


class PythonicToolParser(ToolParser):
    """`[get_weather(city="Paris"), get_time(zone='CET')]` as the whole reply."""

    name = "pythonic"

    def parse(self, text: str, final: bool) -> ParsedText:
        """All content, or (when the reply opens with "[") all calls."""
        stripped = text.lstrip()
        if not stripped:
            return ParsedText(text if final else "")
        if not stripped.startswith("["):
            return ParsedText(text)
        items, closed = _items(stripped)
        if final and not closed:
            return ParsedText(failed=True)
        parsed = ParsedText()
        for item, complete in items:
            try:
                parsed.calls.append(_call(item) if complete else _partial(item))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                # the calls before stay: a streamer already sent them, as written
                parsed.failed = final
                return parsed
            if parsed.calls[-1] is None:
                parsed.calls.pop()
                break
        return parsed


def _items(text: str) -> tuple[list[tuple[str, bool]], bool]:
    """The list's top-level items as (text, complete), and whether the list closed."""
    items, depth, quote, start, pos = [], 0, "", 1, 1
    while pos < len(text):
        char = text[pos]
        if quote:
            pos += 2 if char == "\\" else 1
            quote = "" if char == quote else quote
            continue
        if char in "'\"":
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE and depth:
            depth -= 1
        elif char in ",]" and depth == 0:
            if text[start:pos].strip():
                items.append((text[start:pos], True))
            if char == "]":
                return items, True
            start = pos + 1
        pos += 1
    if text[start:].strip():
        items.append((text[start:], False))
    return items, False


def _call(item: str) -> ParsedCall:
    """A complete `name(key=literal, ...)` as a call with JSON arguments."""
    node = ast.parse(item.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
        raise ValueError("a pythonic tool call takes keyword arguments only")
    arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    return ParsedCall(ast.unparse(node.func), json.dumps(arguments, ensure_ascii=False), True)


def _partial(item: str) -> ParsedCall | None:
    """An unfinished call: its name once written, no arguments yet."""
    match = _NAME.match(item)
    return None if match is None else ParsedCall(match.group(1))
