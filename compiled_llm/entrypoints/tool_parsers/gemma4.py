"""Gemma 4 calls: <|tool_call>call:NAME{key:VALUE,...}<tool_call|>, keys bare, strings between
<|"|> marks, numbers, true/false/null, nested {...} and [...] written the same way. The
arguments stream one top-level member at a time. A thinking channel (<|channel>...<channel|>)
is left in the content, which stays a prefix of the text; --reasoning-parser gemma4 splits it
off before this parser reads the rest."""

from __future__ import annotations

import json
import re
from typing import Any

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    tagged_calls,
)

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_HEAD = re.compile(r"\s*(?:call)?:\s*([\w.\-]+)\s*\{")
_BARE_END = re.compile(r"[,}\]]")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


class _Unfinished(Exception):
    """The text ends inside a value."""


class Gemma4ToolParser(ToolParser):
    """`<|tool_call>call:f{city:<|"|>Paris<|"|>,days:3}<tool_call|>`, one block per call."""

    name = "gemma4"
    skip_special_tokens = False  # the call and string marks are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the first block, then each block's call."""
        return tagged_calls(text, final, START, END, self._call)

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until its name and "{" are written); ValueError for a
        closed block that does not parse."""
        head = _HEAD.match(body)
        if head is None:
            if closed or not re.fullmatch(r"\s*(c(a(l(l)?)?)?)?(:\s*[\w.\-]*\s*)?", body):
                raise ValueError("a Gemma 4 call starts call:NAME{")
            return None
        name, pos, members, done = head.group(1), head.end(), [], False
        try:
            while True:
                pos = _skip(body, pos, " \n\t\r,")
                if body.startswith("}", pos):
                    done, pos = True, pos + 1
                    break
                colon = body.find(":", pos)
                if colon < 0:
                    raise _Unfinished
                key = _unquote(body[pos:colon].strip())
                value, pos = self._value(body, _skip(body, colon + 1, " \n\t\r"), name, key)
                members.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
        except (_Unfinished, ValueError):
            if closed:  # (open, the members before a fault are the call as far as written)
                raise ValueError("an unfinished or malformed Gemma 4 call") from None
        if closed and body[pos:].strip():
            raise ValueError("text after a Gemma 4 call's arguments")
        arguments = "{" + ", ".join(members) + ("}" if done else "")
        return ParsedCall(name, arguments, complete=closed and done)

    def _value(self, text: str, pos: int, function: str | None, key: str | None,
               ) -> tuple[Any, int]:
        """The value at pos and where it ends (function and key given for a top-level
        argument, whose schema types a bare value); _Unfinished at the text's end."""
        if pos >= len(text) or QUOTE.startswith(text[pos:]):
            raise _Unfinished
        if text.startswith(QUOTE, pos):
            end = text.find(QUOTE, pos + len(QUOTE))
            if end < 0:
                raise _Unfinished
            return text[pos + len(QUOTE):end], end + len(QUOTE)
        if text[pos] in "{[":
            return self._container(text, pos)
        stop = _BARE_END.search(text, pos)
        if stop is None:
            raise _Unfinished
        raw = text[pos:stop.start()].strip()
        if not raw:
            raise ValueError("an empty Gemma 4 value")
        if function is not None and self.is_string_param(function, key):
            return raw, stop.start()
        return _bare(raw), stop.start()

    def _container(self, text: str, pos: int) -> tuple[Any, int]:
        """The {...} object or [...] list at pos and where it ends."""
        is_object, items, pos = text[pos] == "{", [], pos + 1
        while True:
            pos = _skip(text, pos, " \n\t\r,")
            if pos >= len(text):
                raise _Unfinished
            if text[pos] == ("}" if is_object else "]"):
                return (dict(items) if is_object else items), pos + 1
            if is_object:
                colon = text.find(":", pos)
                if colon < 0:
                    raise _Unfinished
                key = _unquote(text[pos:colon].strip())
                value, pos = self._value(text, _skip(text, colon + 1, " \n\t\r"), None, None)
                items.append((key, value))
            else:
                value, pos = self._value(text, pos, None, None)
                items.append(value)


def _skip(text: str, pos: int, chars: str) -> int:
    """The first position at or after pos whose character is not in chars."""
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def _unquote(key: str) -> str:
    """A key without the string marks a model sometimes puts around it."""
    if len(key) >= 2 * len(QUOTE) and key.startswith(QUOTE) and key.endswith(QUOTE):
        return key[len(QUOTE):-len(QUOTE)]
    return key


def _bare(raw: str) -> Any:
    """A bare value as vLLM reads it: true/false, null (none, nil), a number, else text."""
    if raw in ("true", "false"):
        return raw == "true"
    if raw.lower() in ("null", "none", "nil"):
        return None
    if _NUMBER.fullmatch(raw):
        return float(raw) if any(c in raw for c in ".eE") else int(raw)
    return raw
