"""Mistral calls after the [TOOL_CALLS] token: a JSON list of {"name", "arguments"} objects
(tokenizers before v11), or name[ARGS]{...} per call (v11 and later); content is the text
before the first [TOOL_CALLS]."""

from __future__ import annotations

import json

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    before_marker,
    holdback,
)
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls, skip_ws

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser(ToolParser):
    """`[TOOL_CALLS][{"name": "f", "arguments": {...}}]` or `[TOOL_CALLS]f[ARGS]{...}`."""

    name = "mistral"
    skip_special_tokens = False  # [TOOL_CALLS] is a control token

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before [TOOL_CALLS], then the calls in either layout."""
        parsed, first = before_marker(text, BOT, final)
        if first < 0:
            return parsed
        pos = skip_ws(text, first + len(BOT))
        try:
            if text.startswith("[", pos):
                parsed.calls, _ = scan_calls(text, pos + 1, final, closer="]")
            else:
                parsed.calls = [call for part in text[first:].split(BOT)[1:]
                                if (call := _args_call(part, final)) is not None]
        except ValueError:
            parsed.failed = final
        return parsed


def _args_call(part: str, final: bool) -> ParsedCall | None:
    """The call of one `name[ARGS]{...}` part (None until the name is complete)."""
    name, found, rest = part.partition(ARGS)
    if not found:
        if final:
            raise ValueError(f"a [TOOL_CALLS] part without {ARGS}")
        return None
    pos = skip_ws(rest, 0)
    try:
        value, end = json.JSONDecoder().raw_decode(rest, pos)
    except json.JSONDecodeError:
        if final:
            raise ValueError("the arguments are not JSON") from None
        return ParsedCall(name.strip(), holdback(rest[pos:], BOT))
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return ParsedCall(name.strip(), rest[pos:end], complete=True)
