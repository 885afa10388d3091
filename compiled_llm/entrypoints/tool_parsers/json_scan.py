"""Reading JSON tool calls out of partial text: the top-level members of an object as far as
they are written, and a call ({"name": ..., "arguments": {...}}) from them, its arguments the
raw JSON text so far (so streamed fragments add up to the final arguments)."""

from __future__ import annotations

import json
import re

from compiled_llm.entrypoints.tool_parsers.base import ParsedCall, ParsedText

_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")
Span = tuple[int, int | None]  # (start, end) of a member's value; end None while unfinished


def skip_ws(text: str, pos: int) -> int:
    """The first non-whitespace position at or after pos."""
    return _WS.match(text, pos).end()


def _value_end(text: str, pos: int, final: bool) -> int | None:
    """Where the JSON value at pos ends; None while unfinished (a number or literal that
    reaches the end of a growing text may still go on). ValueError on bad JSON, final."""
    try:
        _, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        if final:
            raise ValueError(f"bad JSON at {pos}") from None
        return None
    if end == len(text) and not final and text[pos] not in '{["':
        return None
    return end


def _broken(members: dict[str, Span], final: bool, message: str,
            ) -> tuple[dict[str, Span], None]:
    """A malformed object: a ValueError when final; else its members as far as written."""
    if final:
        raise ValueError(message)
    return members, None


def scan_object(text: str, pos: int, final: bool) -> tuple[dict[str, Span], int | None]:
    """The members of the object at text[pos] ("{") and where it ends (None while open);
    ValueError when it is not a JSON object (or, final, is unfinished or malformed; not
    final, a malformed object ends with the members before the fault)."""
    members: dict[str, Span] = {}
    if not text.startswith("{", pos):
        raise ValueError("a tool call must be a JSON object")
    pos = skip_ws(text, pos + 1)
    if text.startswith("}", pos):
        return members, pos + 1
    while pos < len(text):
        key_end = _value_end(text, pos, final)
        if key_end is None:
            break
        key = json.loads(text[pos:key_end])
        pos = skip_ws(text, key_end)
        if pos < len(text) and text[pos] != ":" or not isinstance(key, str):
            return _broken(members, final, "a JSON object key must be a string followed by ':'")
        start = skip_ws(text, pos + 1)
        if start >= len(text):
            break
        end = members[key] = start, _value_end(text, start, final)
        if end[1] is None:
            break
        pos = skip_ws(text, end[1])
        if text.startswith("}", pos):
            return members, pos + 1
        if pos < len(text) and text[pos] != ",":
            return _broken(members, final, "expected ',' or '}' in a JSON object")
        pos = skip_ws(text, pos + 1)
    if final:
        raise ValueError("unfinished JSON object")
    return members, None


def call_from_object(text: str, pos: int, final: bool,
                     argument_keys: tuple[str, ...] = ("arguments", "parameters"),
                     ) -> tuple[ParsedCall | None, int | None]:
    """The call the object at pos spells (None until its name is complete) and the
    object's end; arguments given as a JSON string count once the string is complete."""
    members, end = scan_object(text, pos, final)
    name_span = members.get("name")
    if name_span is None or name_span[1] is None:
        if end is not None:
            raise ValueError("a tool call needs a string name")
        return None, end
    name = json.loads(text[name_span[0]:name_span[1]])
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a string name")
    key = next((k for k in argument_keys if k in members), None)
    arguments = "{}" if key is None and end is not None else ""
    if key is not None:
        start, stop = members[key]
        if stop is not None:
            raw = text[start:stop]
            arguments = json.loads(raw) if raw.startswith('"') else raw
        elif not text.startswith('"', start):
            arguments = text[start:]
    return ParsedCall(name, arguments, complete=end is not None), end


def scan_calls(text: str, pos: int, final: bool, separator: str = ",",
               closer: str | None = None,
               argument_keys: tuple[str, ...] = ("arguments", "parameters"),
               ) -> tuple[list[ParsedCall], int | None]:
    """Call objects from pos, separated by separator, up to closer (or the text's end when
    None); the calls and where the closer ends (None while unclosed). Not final, bad JSON ends
    the scan with the calls before it (the calls as far as written: a streamer finishes their
    arguments from them); final, it is a ValueError."""
    calls: list[ParsedCall] = []
    try:
        return _scan_calls(text, pos, final, separator, closer, argument_keys, calls)
    except ValueError:
        if final:
            raise
        return calls, None


def _scan_calls(text: str, pos: int, final: bool, separator: str, closer: str | None,
                argument_keys: tuple[str, ...], calls: list[ParsedCall],
                ) -> tuple[list[ParsedCall], int | None]:
    """scan_calls' loop, appending to calls as it goes (so an error leaves those found)."""
    pos = skip_ws(text, pos)
    while pos < len(text):
        if closer is not None and text.startswith(closer, pos):
            return calls, pos + len(closer)
        call, end = call_from_object(text, pos, final, argument_keys)
        if call is not None:
            calls.append(call)
        if end is None:
            return calls, None
        pos = skip_ws(text, end)
        if text.startswith(separator, pos):
            pos = skip_ws(text, pos + len(separator))
        elif pos < len(text) and not (closer and text.startswith(closer, pos)):
            raise ValueError(f"expected {separator!r} between tool calls")
    if final and closer is not None:
        raise ValueError(f"tool calls not closed by {closer!r}")
    return calls, None


def list_calls(parsed: ParsedText, text: str, pos: int, final: bool) -> int | None:
    """The JSON list of {"name", "arguments"} calls at text[pos] ("[") into parsed.calls;
    where the list ends (None while it is open or where it does not parse). Final, a list
    that is open, empty or broken marks parsed failed."""
    try:
        parsed.calls, end = scan_calls(text, pos + 1, final, closer="]",
                                       argument_keys=("arguments",))
    except ValueError:
        parsed.failed = final
        return None
    parsed.failed = final and (end is None or not parsed.calls)
    return end
