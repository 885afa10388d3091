"""gpt-oss's harmony replies read as text: the messages (a header with the channel and any
recipient, then the body), and the `openai` tool parser (vLLM's name), whose calls are the
messages addressed to `functions.NAME`. The markers are special tokens, kept in the text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolParser,
    holdback,
)

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass
class HarmonyMessage:
    """One message of a reply: its raw header (role, channel, recipient, content type), its
    body so far, and whether an end marker closed it."""

    header: str
    body: str
    closed: bool = False

    @property
    def channel(self) -> str | None:
        """analysis, commentary or final (None for text outside any header)."""
        found = _CHANNEL.search(self.header)
        return found.group(1) if found else None

    @property
    def recipient(self) -> str | None:
        """Whom the message is addressed to (`functions.NAME` for a tool call), if anyone."""
        found = _RECIPIENT.search(self.header)
        return found.group(1) if found else None

    @property
    def visible(self) -> bool:
        """Whether the user sees it: the final channel, a preamble (commentary to nobody),
        or text the model wrote outside any header."""
        channel = self.channel
        return channel in ("final", None) or (channel == "commentary" and not self.recipient)

    @property
    def function(self) -> str | None:
        """The function a tool call names (None for any other message)."""
        recipient = self.recipient or ""
        return recipient.removeprefix("functions.") if recipient.startswith("functions.") \
            else None


def harmony_messages(text: str, final: bool) -> list[HarmonyMessage]:
    """The messages of a reply (the prompt having written `<|start|>assistant`); not final, a
    header still open is left out and a partial marker at a body's end held back."""
    messages: list[HarmonyMessage] = []
    pos = 0
    while pos < len(text):
        started = text.startswith(START, pos)
        pos += len(START) if started else 0
        mark = text.find(MESSAGE, pos)
        if started and mark < 0:
            break  # the header is still being written (or never was: nothing to show)
        ends = [at for at in (text.find(end, pos) for end in (*ENDS, START)) if at >= 0]
        if mark < 0 or (ends and min(ends) < mark) or (not started and _plain(text, pos)):
            pos = _headerless(text, pos, final, messages)
            continue
        pos = _message(text, pos, mark, final, messages)
    return messages


def _plain(text: str, pos: int) -> bool:
    """Whether text at pos is plain text before a later <|channel|> (not a header's start,
    which is the channel itself or a recipient written first)."""
    channel = text.find(CHANNEL, pos)
    return channel > pos and not text[pos:channel].lstrip().startswith("to=")


def _header_start(text: str) -> bool:
    """Whether text may be a header being written: a marker, or a recipient (to=) first."""
    stripped = text.lstrip()
    return text.startswith("<") or stripped.startswith("to=") or "to=".startswith(stripped)


def _boundaries(text: str, pos: int) -> list[tuple[int, str]]:
    """Where text after pos may stop being one message: an end marker (consumed), the next
    message's start, or a <|channel|> after plain text (each the next message's first
    character)."""
    found = [(at, end) for end in (*ENDS, START) if (at := text.find(end, pos)) >= 0]
    plain = [(text.find(CHANNEL, pos), CHANNEL)] if _plain(text, pos) else []
    return found + plain


def _headerless(text: str, pos: int, final: bool, messages: list[HarmonyMessage]) -> int:
    """Text with no header before its end (plain text, or a header still open): a bodyless
    plain message up to the next end marker; where it runs to the text's end and may still
    become a header, nothing yet."""
    ends = _boundaries(text, pos)
    if not ends:
        if final and not text.startswith(CHANNEL, pos):
            messages.append(HarmonyMessage("", text[pos:], closed=True))
        elif not _header_start(text[pos:]) and MESSAGE not in text[pos:]:
            messages.append(HarmonyMessage("", holdback(text[pos:], CHANNEL, *ENDS, START)))
        return len(text)
    at, end = min(ends)
    if at > pos:
        messages.append(HarmonyMessage("", text[pos:at], closed=True))
    return at if end in (START, CHANNEL) else at + len(end)


def _message(text: str, pos: int, mark: int, final: bool,
             messages: list[HarmonyMessage]) -> int:
    """The message whose header is text[pos:mark]; where the next one starts."""
    body_at = mark + len(MESSAGE)
    ends = [(at, end) for end in (*ENDS, START) if (at := text.find(end, body_at)) >= 0]
    if not ends:
        body = text[body_at:]
        messages.append(HarmonyMessage(text[pos:mark], body if final else
                                       holdback(body, *ENDS, START), closed=final))
        return len(text)
    at, end = min(ends)
    messages.append(HarmonyMessage(text[pos:mark], text[body_at:at], closed=True))
    return at if end == START else at + len(end)


def join_bodies(messages: list[HarmonyMessage]) -> str:
    """The non-empty bodies joined by newlines (as vLLM flattens several messages)."""
    return "\n".join(message.body for message in messages if message.body)


class HarmonyToolParser(ToolParser):
    """gpt-oss (`--tool-call-parser openai`): a call is a message to `functions.NAME` whose
    body is the JSON arguments; content is the final channel and the preambles (the analysis
    channel is reasoning, not content)."""

    name = "openai"
    skip_special_tokens = False

    def parse(self, text: str, final: bool) -> ParsedText:
        """The visible messages before the first call as content, then each call."""
        messages = harmony_messages(text, final)
        first = next((i for i, m in enumerate(messages) if m.function is not None),
                     len(messages))
        parsed = ParsedText(join_bodies([m for m in messages[:first] if m.visible]))
        for message in messages[first:]:
            if message.function is not None:
                arguments = message.body.strip()
                parsed.calls.append(ParsedCall(message.function, arguments,
                                               complete=message.closed and _is_json(arguments)))
        return parsed


def _is_json(text: str) -> bool:
    """Whether a call's body is whole JSON: its end marker (<|call|>) is a stop token, never
    in the text, so a body cut off by max_tokens shows only as JSON that does not parse."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
