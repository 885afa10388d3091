"""Thinking spans marked by a start and end tag (<think>...</think> here, a family's own in
families.py): the split of a reply into reasoning and content (prefix-stable, so a streamer
diffs it), whether the prompt or chat_template_kwargs leave thinking on, and the span's end
token (which gates grammars and which a thinking budget forces)."""

from __future__ import annotations

import contextlib
import weakref
from functools import partial
from typing import ClassVar

from compiled_llm.entrypoints.tool_parsers.base import holdback

# chat templates' turn markers: a tag before the current turn's last one is an earlier turn's
# (GLM-4.5 writes <think></think> into every past assistant turn, Qwen3 a tool loop's spans)
TURN_MARKERS = ("<|im_start|>", "<|im_end|>", "<|assistant|>", "<|user|>", "<|observation|>",
                "<|system|>", "<\uff5cAssistant\uff5c>", "<\uff5cUser\uff5c>",
                "<|start_header_id|>", "<|eot_id|>", "[INST]", "[/INST]", "<|start_of_role|>",
                "<|end_of_text|>", "<seed:bos>", "<seed:eos>", "]~b]", "[e~[")
_markers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ReasoningParser:
    """A <think>...</think> span at the start of the reply. prompt_state: the prompt's last
    tag ("open": the template wrote the start tag, the reply starts in the span; "closed":
    it wrote the whole span, as enable_thinking=False does; "none": no tag)."""

    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    always_thinks: ClassVar[bool] = False
    """The reply starts in the span even with no start tag anywhere (DeepSeek-R1)."""
    thinking_kwargs: ClassVar[tuple[str, ...]] = ()
    """chat_template_kwargs that turn the family's thinking on; where set, the reply is all
    content unless one of them is true (DeepSeek-V3.1's `thinking`, as vLLM reads it)."""
    skip_special_tokens: ClassVar[bool] = True
    """False where the tags are special tokens (they must stay in the reply's text)."""
    end_is_token_sequence: ClassVar[bool] = False
    """True where an end tag of several tokens is always written as the same tokens (special
    tokens around a word: gpt-oss's), so grammars may wait for that token sequence."""

    def __init__(self, prompt_state: str = "none", thinking: bool = True) -> None:
        self.prompt_state, self.thinking = prompt_state, thinking

    @classmethod
    def for_prompt(cls, prompt_ids: list[int], tokenizer,
                   template_kwargs: dict | None = None) -> ReasoningParser:
        """The parser for the reply to prompt_ids (rendered with template_kwargs), its
        prompt_state read from the tags after the last turn marker (the generation prompt's
        turn; as vLLM's parsers read it)."""
        return cls(prompt_state(cls, prompt_ids, tokenizer), cls.thinking_on(template_kwargs))

    @classmethod
    def thinking_on(cls, template_kwargs: dict | None) -> bool:
        """Whether template_kwargs leave thinking on (always, without thinking_kwargs)."""
        if not cls.thinking_kwargs:
            return True
        return any(bool((template_kwargs or {}).get(key)) for key in cls.thinking_kwargs)

    @property
    def starts_thinking(self) -> bool:
        """Whether the reply starts inside the span (no start tag needed)."""
        return self.thinking and (self.prompt_state == "open" or
                                  (self.always_thinks and self.prompt_state == "none"))

    @property
    def may_think(self) -> bool:
        """Whether the reply may open with a span (constraints wait for its end)."""
        return self.thinking and self.prompt_state != "closed"

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(reasoning or None, content) of the reply so far; not final, a partial tag is
        held back. A span never closed is all reasoning."""
        if not self.thinking:
            return None, text
        stripped = text.lstrip()
        opened = stripped.startswith(self.start)
        if not final and not opened and self.start.startswith(stripped) and stripped:
            return None, ""  # may still become the start tag
        if opened:
            body = stripped[len(self.start):]
        elif self.starts_thinking:
            body = text
        else:
            return None, text
        reasoning, found, content = body.partition(self.end)
        if not found:
            return (reasoning if final else holdback(reasoning, self.end)), ""
        return reasoning, self.answer(content, final)

    def answer(self, content: str, final: bool) -> str:
        """The reply's content after the span (a family that wraps it strips the wrapper)."""
        return content

    @classmethod
    def keeps_special_tokens(cls, tokenizer) -> bool:
        """Whether the reply must be decoded with its special tokens: the family says so, or
        a tag is a special token of tokenizer (decoding would drop it from the text)."""
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special = set(getattr(tokenizer, "all_special_ids", ()))
        return not cls.skip_special_tokens or any(
            i is not None and (i in special or getattr(added.get(i), "special", False))
            for i in cls.token_ids(tokenizer))

    @classmethod
    def end_ids(cls, tokenizer) -> int | tuple[int, ...] | None:
        """The end tag as one token id, or as its token sequence where the family writes it
        so (end_is_token_sequence); None where neither marks it."""
        end_id = cls.token_ids(tokenizer)[1]
        if end_id is not None or not cls.end_is_token_sequence:
            return end_id
        return tuple(tokenizer.encode(cls.end, add_special_tokens=False)) or None

    @classmethod
    def token_ids(cls, tokenizer) -> tuple[int | None, int | None]:
        """(start, end) tag ids where each tag is one token of tokenizer, else None."""
        return _single_token(tokenizer, cls.start), _single_token(tokenizer, cls.end)


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: the reply thinks when it opens with <think> or the template opened the span
    (enable_thinking=False renders an empty span in the prompt: no reasoning)."""


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1: the reply is reasoning up to </think>; the start tag may be absent (the
    template writes it)."""

    always_thinks = True


def prompt_state(parser: type[ReasoningParser], prompt_ids: list[int], tokenizer) -> str:
    """The prompt's last tag in its current turn: "open", "closed" or "none". Tags of one
    token each are read from the ids; longer ones from the turn's decoded text."""
    start_id, end_id = parser.token_ids(tokenizer)
    markers = turn_marker_ids(tokenizer)
    for turn in range(len(prompt_ids), 0, -1):
        token = prompt_ids[turn - 1]
        if None not in (start_id, end_id) and token in (start_id, end_id):
            return "open" if token == start_id else "closed"
        if token in markers:
            break
    else:
        turn = 0
    if None not in (start_id, end_id):
        return "none"
    text = tokenizer.decode(prompt_ids[turn:], skip_special_tokens=False)
    opened, closed = text.rfind(parser.start), text.rfind(parser.end)
    if opened == closed:  # both absent
        return "none"
    return "open" if opened > closed else "closed"


def turn_marker_ids(tokenizer) -> frozenset[int]:
    """The ids of TURN_MARKERS that are one token of tokenizer (cached while it lives)."""
    try:
        return _markers[tokenizer]
    except (KeyError, TypeError):
        pass
    ids = frozenset(i for i in map(partial(_single_token, tokenizer), TURN_MARKERS)
                    if i is not None)
    with contextlib.suppress(TypeError):  # a tokenizer that takes no weak reference
        _markers[tokenizer] = ids
    return ids


def _single_token(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
