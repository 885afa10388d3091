"""xLAM calls: a JSON list of {"name": ..., "arguments": {...}} objects, as the whole reply or
after a ```json (or ```) fence, <tool_call> or [TOOL_CALLS]; content is the text before the
fence or tag (the layouts vLLM's parser looks for, read the same way streamed or whole)."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser, holdback
from compiled_llm.entrypoints.tool_parsers.json_scan import list_calls, skip_ws

FENCE, TAG, BOT = "```", "<tool_call>", "[TOOL_CALLS]"


class XLAMToolParser(ToolParser):
    """`[{"name": "f", "arguments": {"x": 1}}]`, or the list after ```json, <tool_call> or
    [TOOL_CALLS]."""

    name = "xlam"

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content before the list's opener, then the list's calls."""
        lead = skip_ws(text, 0)
        if not final and lead < len(text) and BOT.startswith(text[lead:]):
            return ParsedText()  # "[" may open a list or [TOOL_CALLS]: wait for more
        if text.startswith("[", lead) and not text.startswith(BOT, lead):
            return _calls(ParsedText(), text, lead, final)
        found = [(at, m) for m in (FENCE, TAG, BOT) if (at := text.find(m)) >= 0]
        if not found:
            return ParsedText(text if final else holdback(text, FENCE, TAG, BOT))
        at, marker = min(found)
        pos = at + len(marker)
        if marker == FENCE:
            if not final and "json".startswith(text[pos:pos + 4]) and len(text) < pos + 4:
                return ParsedText(text[:at])
            pos += 4 if text.startswith("json", pos) else 0
        pos = skip_ws(text, pos)
        if pos >= len(text) or text[pos] != "[":
            return ParsedText(text[:at], failed=final or pos < len(text))
        return _calls(ParsedText(text[:at]), text, pos, final)


def _calls(parsed: ParsedText, text: str, pos: int, final: bool) -> ParsedText:
    """The list's calls at text[pos] ("[") into parsed (text after the list ignored)."""
    list_calls(parsed, text, pos, final)
    return parsed
