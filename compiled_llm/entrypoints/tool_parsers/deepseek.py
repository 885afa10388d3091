"""DeepSeek calls between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, each
<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>: V3 (and R1) write `function<｜tool▁sep｜>NAME` and
the arguments in a ```json fence; V3.1 writes `NAME<｜tool▁sep｜>ARGUMENTS`. The arguments are
the model's JSON text, streamed as it comes."""

from __future__ import annotations

import json

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    section_calls,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END)  # section, then call: start, end
FENCE, FENCE_END = "```json", "```"
_DECODER = json.JSONDecoder()


def json_arguments(raw: str, closed: bool) -> tuple[str, bool]:
    """(the JSON object's text so far, whether it is whole) from a call's raw arguments; not
    closed, trailing whitespace is held back (the caller holds back partial markers).
    ValueError when the text is not a JSON object (a closed call's only, or one whose object
    ended)."""
    text = raw.lstrip()
    try:
        value, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError:
        if closed:
            raise ValueError("the tool call's arguments are not JSON") from None
        return ("" if not text.startswith("{") else text.rstrip()), False
    if not isinstance(value, dict):
        if closed:
            raise ValueError("the tool call's arguments must be a JSON object")
        return "", False  # not an object (a final parse fails): nothing to stream
    return text[:end], True


class DeepSeekV3ToolParser(ToolParser):
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}
    \\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`."""

    name = "deepseek_v3"
    skip_special_tokens = False  # the markers are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before <｜tool▁calls▁begin｜>, then each call block's call."""
        parsed, done = section_calls(text, final, MARKERS, self._call)
        if done is not None:
            parsed.failed |= final and not parsed.calls
        return parsed

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until its name is complete); ValueError when it does not
        parse."""
        _, sep, rest = body.partition(SEP)
        name, newline, raw = rest.partition("\n")
        if not (sep and newline):
            if closed:
                raise ValueError("a DeepSeek tool call without a name line")
            return None
        raw = raw.lstrip()
        if not raw.startswith(FENCE):
            if closed or not FENCE.startswith(raw):
                raise ValueError("DeepSeek V3 arguments come in a ```json fence")
            return _named(name, "", False)
        raw = raw[len(FENCE):]
        arguments, whole = json_arguments(raw, closed)
        if closed:
            tail = raw.lstrip()[len(arguments):].strip()
            if tail != FENCE_END:
                raise ValueError("text after a DeepSeek V3 call's arguments")
        return _named(name, arguments, closed and whole)


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>`."""

    name = "deepseek_v31"

    def _call(self, body: str, closed: bool) -> ParsedCall | None:
        """One block's call (None until its name is complete); ValueError when it does not
        parse."""
        name, sep, raw = body.partition(SEP)
        if not sep:
            if closed:
                raise ValueError("a DeepSeek tool call without <｜tool▁sep｜>")
            return None
        arguments, whole = json_arguments(raw, closed)
        if closed and raw.strip()[len(arguments):]:
            raise ValueError("text after a DeepSeek call's arguments")
        return _named(name, arguments, closed and whole)


def _named(name: str, arguments: str, complete: bool) -> ParsedCall:
    """The call, its name stripped; ValueError for an empty name."""
    if not name.strip():
        raise ValueError("a DeepSeek tool call needs a function name")
    return ParsedCall(name.strip(), arguments, complete=complete)
