"""The reasoning parsers of further model families, by vLLM's names: DeepSeek-V3.1 (thinking
only when asked), Granite's sentence markers, Mistral's [THINK] control tokens, Seed-OSS,
MiniMax-M2, ERNIE 4.5 and Hunyuan-A13B (their answer wrappers stripped), OLMo 3, gpt-oss's
harmony channels and Gemma 4's thought channel."""

from __future__ import annotations

from typing import ClassVar

from compiled_llm.entrypoints.reasoning_parsers.base import (
    ReasoningParser,
    _single_token,
    prompt_state,
)
from compiled_llm.entrypoints.tool_parsers.base import holdback
from compiled_llm.entrypoints.tool_parsers.harmony import (
    MESSAGE,
    START,
    harmony_messages,
    join_bodies,
)


class DeepSeekV3ReasoningParser(ReasoningParser):
    """DeepSeek-V3.1: thinks only when chat_template_kwargs `thinking` (or `enable_thinking`)
    is true, then as DeepSeek-R1 (the template writes <think>); otherwise the reply is all
    content, as vLLM's deepseek_v3."""

    always_thinks = True
    thinking_kwargs = ("thinking", "enable_thinking")


GRANITE_STARTS = ("Here is my thought process:", "Here's my thought process:")
GRANITE_ENDS = ("Here is my response:", "Here's my response:")


class GraniteReasoningParser(ReasoningParser):
    """IBM Granite 3.2+: a reply that opens with "Here is my thought process:" thinks up to
    "Here is my response:" ("Here's" too: quantized models write it). Read in every reply
    (as vLLM's); constraints wait for it only where chat_template_kwargs thinking=true asks
    for thinking (the markers are several tokens: such a request is refused)."""

    start, end = GRANITE_STARTS[0], GRANITE_ENDS[0]
    thinking_kwargs = ("thinking",)

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(reasoning or None, content), the markers' alternatives matched."""
        stripped = text.lstrip()
        start = next((s for s in GRANITE_STARTS if stripped.startswith(s)), None)
        if start is None:
            if not final and stripped and any(s.startswith(stripped) for s in GRANITE_STARTS):
                return None, ""  # may still become the start marker
            return None, text
        body = stripped[len(start):]
        cuts = sorted((body.find(end), end) for end in GRANITE_ENDS if end in body)
        if not cuts:
            return (body if final else holdback(body, *GRANITE_ENDS)), ""
        at, end = cuts[0]
        return body[:at], body[at + len(end):]


class MistralReasoningParser(ReasoningParser):
    """Mistral (Magistral): [THINK]...[/THINK] control tokens, kept in the reply's text; the
    reply thinks when it opens with [THINK] ([INST]/[/INST] bound the current turn, so the
    system prompt's own tags are not read as the prompt's state)."""

    start, end = "[THINK]", "[/THINK]"
    skip_special_tokens = False


class SeedOssReasoningParser(ReasoningParser):
    """ByteDance Seed-OSS: <seed:think>...</seed:think>; the reply is reasoning up to the end
    tag, with or without the start tag (as vLLM's seed_oss)."""

    start, end = "<seed:think>", "</seed:think>"
    always_thinks = True


class MiniMaxM2ReasoningParser(ReasoningParser):
    """MiniMax-M2: the template writes <think>; the reply is reasoning up to </think>."""

    always_thinks = True


class MiniMaxM2AppendThinkReasoningParser(MiniMaxM2ReasoningParser):
    """MiniMax-M2, vLLM's minimax_m2_append_think: the whole reply is content with the
    template's <think> put back in front (for clients that keep the span in the history);
    constraints still start after </think>."""

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(None, "<think>" + text)."""
        return None, self.start + text


class WrappedAnswerParser(ReasoningParser):
    """A family that wraps the content after the span in answer_tags (newlines around each
    tag are the format's, stripped); content without the open tag is left as it is."""

    answer_tags: ClassVar[tuple[str, str]]

    def answer(self, content: str, final: bool) -> str:
        """content without the wrapper; not final, a wrapper tag's start is held back."""
        open_tag, close_tag = self.answer_tags
        body = content.lstrip("\n")
        if not body.startswith(open_tag):
            return "" if not final and open_tag.startswith(body) else content
        inner = body[len(open_tag):].removeprefix("\n")
        at = inner.find(close_tag)
        if at >= 0:
            return inner[:at].removesuffix("\n")
        return inner if final else holdback(inner, "\n" + close_tag)


class Ernie45ReasoningParser(WrappedAnswerParser):
    """ERNIE 4.5 thinking models: reasoning up to </think> (the start tag may be absent),
    then the content, bare or in <response>...</response>."""

    always_thinks = True
    answer_tags = ("<response>", "</response>")


class HunyuanA13BReasoningParser(WrappedAnswerParser):
    """Hunyuan-A13B: "<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>" (fast thinking
    writes an empty span); a reply that does not open with the span is all content, and an
    empty span is no reasoning."""

    start, end = "<think>\n", "\n</think>"
    answer_tags = ("<answer>", "</answer>")

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """The base split, an empty finished span read as no reasoning (as vLLM's)."""
        reasoning, content = super().split(text, final)
        return (None if final and reasoning == "" else reasoning), content


class Olmo3ReasoningParser(ReasoningParser):
    """OLMo 3 Think: <think>...</think> in plain text (several tokens each; the prompt's
    state is read from its text); the reply is reasoning up to </think>, the template
    having written <think>."""

    always_thinks = True


class GptOssReasoningParser(ReasoningParser):
    """gpt-oss (vLLM's openai_gptoss): harmony channels, read from the reply's messages. The
    analysis channel is reasoning; the final channel and preambles are content, several
    messages joined by newlines (as vLLM's); tool calls (messages to functions.NAME) stay in
    the content in their harmony form only where the `openai` tool parser reads them
    (keep_calls). Grammars start after the end sequence, whose tokens are the model's own."""

    start, end = "<|channel|>analysis<|message|>", "<|channel|>final<|message|>"
    skip_special_tokens = False
    end_is_token_sequence = True

    def __init__(self, prompt_state: str = "none", thinking: bool = True) -> None:
        super().__init__(prompt_state, thinking)
        self.keep_calls = False

    @classmethod
    def for_prompt(cls, prompt_ids: list[int], tokenizer,
                   template_kwargs: dict | None = None) -> GptOssReasoningParser:
        """Every reply may think: earlier turns' channels say nothing about this one."""
        return cls()

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(the analysis bodies or None, the visible bodies and any kept calls)."""
        messages = harmony_messages(text, final)
        reasoning = join_bodies([m for m in messages if m.channel == "analysis"])
        content = join_bodies([m for m in messages if m.visible])
        if self.keep_calls:
            content += "".join(f"{START}{m.header}{MESSAGE}{m.body}" for m in messages
                               if m.function is not None)
        return reasoning or None, content


class Gemma4ReasoningParser(ReasoningParser):
    """Gemma 4: thinks in a channel, `<|channel>thought\\n...<channel|>` (special tokens, kept
    in the text); the "thought\\n" label is not reasoning (as vLLM's gemma4). The prompt's
    state is read from the current turn, where a finished tool exchange (<tool_response|>)
    also starts afresh and a call (<|tool_call>) has ended the thinking. A reply that opens
    with the channel always thinks; grammars wait for <channel|> only where the template
    asked for thinking (its <|think|> in the prompt) or opened the channel."""

    start, end = "<|channel>", "<channel|>"
    label = "thought\n"
    skip_special_tokens = False
    boundaries: ClassVar[tuple[str, ...]] = ("<|turn>", "<tool_response|>")

    def __init__(self, prompt_state: str = "none", thinking: bool = True,
                 asked: bool = True) -> None:
        super().__init__(prompt_state, thinking)
        self.asked = asked

    @classmethod
    def for_prompt(cls, prompt_ids: list[int], tokenizer,
                   template_kwargs: dict | None = None) -> Gemma4ReasoningParser:
        """The parser for the reply to prompt_ids: its state from the current turn's last
        channel tag, and whether the prompt holds <|think|> (the template's thinking switch;
        a tokenizer without it asks always)."""
        start_id, end_id = cls.token_ids(tokenizer)
        if None in (start_id, end_id):  # not Gemma 4's tokenizer: the text's tags decide
            return cls(prompt_state(cls, prompt_ids, tokenizer))
        bounds = {_single_token(tokenizer, marker) for marker in cls.boundaries}
        ended = {end_id, _single_token(tokenizer, "<|tool_call>")} - {None}
        state = "none"
        for token in reversed(prompt_ids):
            if token == start_id or token in ended:
                state = "open" if token == start_id else "closed"
                break
            if token in bounds:
                break
        think_id = _single_token(tokenizer, "<|think|>")
        return cls(state, asked=think_id is None or think_id in prompt_ids)

    @property
    def may_think(self) -> bool:
        """Whether grammars wait for the channel's end: the template asked for thinking or
        opened the channel (a reply never asked to think is constrained from its start)."""
        return super().may_think and (self.asked or self.prompt_state == "open")

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """The base split, the channel's "thought\\n" label dropped from the reasoning (held
        back while the open span may still become it)."""
        reasoning, content = super().split(text, final)
        if reasoning is None:
            return None, content
        if reasoning.startswith(self.label):
            return reasoning[len(self.label):], content
        if not final and self.end not in text and self.label.startswith(reasoning):
            return "", content  # may still become the label
        return reasoning, content
