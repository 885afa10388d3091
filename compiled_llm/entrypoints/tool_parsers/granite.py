"""IBM Granite 3.x calls: the reply is a JSON list of {"name", "arguments"} objects, after
<|tool_call|> (3.0) or <tool_call> (3.1); a reply that starts otherwise is content."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.base import ParsedText, ToolParser
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls, skip_ws

BOT_TOKEN, BOT_STRING = "<|tool_call|>", "<tool_call>"


class GraniteToolParser(ToolParser):
    """`<|tool_call|>[{"name": "f", "arguments": {...}}, ...]` as the whole reply."""

    name = "granite"
    skip_special_tokens = False  # <|tool_call|> is a special token in Granite 3.0

    def parse(self, text: str, final: bool) -> ParsedText:
        """All content, or (when the reply opens with a tag or "[") all calls."""
        pos = skip_ws(text, 0)
        for tag in (BOT_TOKEN, BOT_STRING):
            rest = text[pos:]
            if not final and (not rest or tag.startswith(rest)):
                return ParsedText()
            if rest.startswith(tag):
                pos = skip_ws(text, pos + len(tag))
        if pos == len(text) and not final:
            return ParsedText()
        if not text.startswith("[", pos):
            return ParsedText(text)
        try:
            calls, end = scan_calls(text, pos + 1, final, closer="]",
                                    argument_keys=("arguments",))
        except ValueError:
            return ParsedText(failed=final)
        # vLLM reads the reply as one JSON list: nothing may follow it
        return ParsedText("", calls, failed=final and (not calls or bool(text[end:].strip())))
