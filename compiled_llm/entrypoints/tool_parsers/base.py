"""What every tool-call parser shares: the parse result (content before the calls, each
call's name and JSON arguments so far), the final extraction to OpenAI tool calls, and the
streamer that diffs successive parses into OpenAI tool-call deltas. A parse is prefix-stable
(content and arguments only grow; a call shows once its name is complete), so one streamer
serves every format."""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class ParsedCall:
    """One tool call: its function name and its arguments as JSON text (so far)."""

    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ParsedText:
    """The content (text outside the calls) and the calls found; failed when, at the end, a
    call block does not parse (the whole text is then content)."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    failed: bool = False


ParseFn = Callable[[str, bool], ParsedText]


def loose_value(text: str) -> Any:
    """text read as JSON, else as a Python literal (True, None, single quotes: models write
    them), else text itself."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def holdback(text: str, *markers: str) -> str:
    """text without its longest suffix that is a proper prefix of a marker (what may yet
    turn into the marker, so is not streamed as content)."""
    for size in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(marker.startswith(text[-size:]) for marker in markers):
            return text[:-size]
    return text


def before_marker(text: str, marker: str, final: bool) -> tuple[ParsedText, int]:
    """The text before the first marker as a parse's content, and where the marker starts
    (-1 when absent: then all the text is content, a partial marker held back unless
    final)."""
    first = text.find(marker)
    if first < 0:
        return ParsedText(text if final else holdback(text, marker)), -1
    return ParsedText(text[:first]), first


def as_written(read: Callable[[str, bool], ParsedCall | None], body: str) -> ParsedCall | None:
    """A closed call block that does not parse read as if still open (what a streamer sent of
    it), not complete; None where even that does not parse."""
    try:
        call = read(body, False)
    except ValueError:
        return None
    if call is not None:
        call.complete = False
    return call


def read_blocks(parts: list[str], end: str, read: Callable[[str, bool], ParsedCall | None],
                parsed: ParsedText) -> bool:
    """Each call block's text (after its start marker; `end` closes it) read into
    parsed.calls up to the first that is not complete: one that does not parse goes in as
    written (not complete) and marks parsed failed; one whose call has not begun (None)
    stops the reading. Whether every block gave a complete call."""
    for part in parts:
        body, closed, _ = part.partition(end)
        try:
            call = read(body, bool(closed))
        except ValueError:
            parsed.failed = True
            call = as_written(read, body)
        if call is None:
            return False
        parsed.calls.append(call)
        if not call.complete:
            return False
    return True


def tagged_calls(text: str, final: bool, start: str, end: str,
                 read: Callable[[str, bool], ParsedCall | None]) -> ParsedText:
    """Content before the first `start`, then each start..end block's call (read_blocks);
    final, a block that gave no complete call fails the parse."""
    parsed, first = before_marker(text, start, final)
    if first >= 0:
        whole = read_blocks(text[first:].split(start)[1:], end, read, parsed)
        parsed.failed |= final and not whole
    return parsed


def section_calls(text: str, final: bool, markers: tuple[str, str, str, str],
                  read: Callable[[str, bool], ParsedCall | None]
                  ) -> tuple[ParsedText, bool | None]:
    """Content before the section, then each call block in it (read_blocks); markers are
    (section start, section end, call start, call end). While the section is open a partial
    marker is held back: arguments that do not parse stream as written, so text a later
    marker cuts off must not go out. Also whether the section closed (None: none began)."""
    section, section_end, call, call_end = markers
    parsed, first = before_marker(text, section, final)
    if first < 0:
        return parsed, None
    region, done, _ = text[first + len(section):].partition(section_end)
    region = region if done or final else holdback(region, section_end, call, call_end)
    read_blocks(region.split(call)[1:], call_end, read, parsed)
    return parsed, bool(done)


def tool_call_id() -> str:
    """A fresh tool-call id, vLLM's style."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """An OpenAI tool call object."""
    return {"id": call_id or tool_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def unparsed(parsed: ParsedText) -> bool:
    """Whether a final parse's calls do not all parse (then the whole text is content)."""
    return parsed.failed or not all(call.complete for call in parsed.calls)


def final_arguments(call: ParsedCall) -> str:
    """A call's arguments as sent: "{}" for a complete call written without any."""
    return call.arguments or ("{}" if call.complete else "")


def extract(parse: ParseFn, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a finished text: the text before the calls as the stream
    sends it (its whitespace kept, as vLLM's parsers keep it), None when it is blank (the
    newlines between a reasoning end and the first call); a text whose calls do not all parse
    is all content, with no calls."""
    parsed = parse(text, True)
    if unparsed(parsed):
        return text or None, []
    calls = [tool_call(call.name, final_arguments(call)) for call in parsed.calls]
    content = parsed.content if not calls or parsed.content.strip() else None
    return content or None, calls


class ToolParser:
    """Base of the parsers: `parse` is the one method a format implements. tools (the
    request's, OpenAI's shape) let a parser read argument types from their schemas."""

    name: ClassVar[str] = ""
    skip_special_tokens: ClassVar[bool] = True
    """False where the format's markers are special tokens (the text must keep them)."""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.functions = {tool["function"]["name"]: tool["function"] for tool in tools or []}

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content and calls in text; not final, a partial marker or call is held back."""
        raise NotImplementedError

    def param_type(self, function: str, key: str, default: Any = None) -> Any:
        """The schema type of function's parameter key (a name or a list of names; default
        where the request's tools do not say)."""
        schema = self.functions.get(function, {}).get("parameters") or {}
        return (schema.get("properties") or {}).get(key, {}).get("type", default)

    def is_string_param(self, function: str, key: str) -> bool:
        """Whether the schema lets function's parameter key be a string (kept as written)."""
        kind = self.param_type(function, key)
        return kind == "string" or (isinstance(kind, list) and "string" in kind)

    def extract(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool calls) of a finished text."""
        return extract(self.parse, text)


class ToolCallStreamer:
    """Feeds text deltas to a parse function and answers each with (content delta, OpenAI
    tool-call deltas): a new call's first delta has its index, id, type and name (and the
    arguments so far), later ones only argument fragments.

    Invariant: each streamed call's argument fragments add up to its arguments in the final
    parse (extract's calls), or, where that parse fails, to its arguments as far as written.
    A call goes out only once it has arguments, so a reply cut off (max_tokens) right after a
    call's name leaves no call with empty arguments behind."""

    def __init__(self, parse: ParseFn) -> None:
        self._parse, self.text = parse, ""
        self._content_sent = 0
        self._calls: list[tuple[str, int]] = []  # (id, argument characters sent) per call

    @property
    def called(self) -> bool:
        """Whether any tool-call delta went out."""
        return bool(self._calls)

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """The deltas the new text (and, final, the end of it) makes."""
        self.text += delta
        parsed = self._parse(self.text, final)
        if final and unparsed(parsed):
            parsed = self._unparsed_end()
        content = parsed.content[self._content_sent:]
        self._content_sent = max(self._content_sent, len(parsed.content))
        return content, [d for i, call in enumerate(parsed.calls) if (d := self._delta(i, call))]

    def _unparsed_end(self) -> ParsedText:
        """The end of a reply whose calls do not all parse: all content while no call went
        out (as extract reads it); else no more content or calls, only the rest of each sent
        call's arguments as far as the text goes."""
        if not self._calls:
            return ParsedText(self.text)
        return ParsedText("", self._parse(self.text, False).calls[:len(self._calls)])

    def _delta(self, index: int, call: ParsedCall) -> dict[str, Any] | None:
        arguments = final_arguments(call)
        if index >= len(self._calls):
            if index > len(self._calls) or not arguments:
                return None
            self._calls.append((tool_call_id(), len(arguments)))
            return {"index": index, "id": self._calls[index][0], "type": "function",
                    "function": {"name": call.name, "arguments": arguments}}
        call_id, sent = self._calls[index]
        if len(arguments) <= sent:
            return None
        self._calls[index] = (call_id, len(arguments))
        return {"index": index, "function": {"arguments": arguments[sent:]}}
