"""A chat reply read back: the thinking span split off into reasoning_content (with the
reasoning parser), the rest read for tool calls (with the ToolPlan), as one assistant
message or as stream deltas per choice. Also the sampling changes these need: the tool
grammar, the gate that holds any grammar until the thinking ends, the thinking budget."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from compiled_llm.entrypoints.reasoning_parsers.base import ReasoningParser
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.sample.thinking_budget import ThinkingBudget
from compiled_llm.sampling_params import SamplingParams


@dataclass
class ReplyFormat:
    """How one request's replies are read: its tool plan and (with --reasoning-parser) the
    reasoning parser for its prompt."""

    plan: ToolPlan
    reasoning: ReasoningParser | None = None
    include_reasoning: bool = True
    """vLLM's include_reasoning: false drops the thinking span from the reply (it is still
    split off, never shown as content)."""
    end_id: int | tuple[int, ...] | None = None
    """The thinking span's end tag as one token, or as its fixed token sequence (None:
    neither; no span is counted)."""

    def reasoning_tokens(self, text: str, token_ids: list[int]) -> int | None:
        """How many of a finished reply's token_ids (whose text is text) are thinking; None
        without a reasoning parser (no completion_tokens_details then, as vLLM)."""
        if self.reasoning is None:
            return None
        return reasoning_token_count(self.split(text, True)[0], token_ids, self.end_id)

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(reasoning, the rest) of the reply so far."""
        return (None, text) if self.reasoning is None else self.reasoning.split(text, final)

    @property
    def parses(self) -> bool:
        """Whether replies are read by a parser (reasoning, or tools other than "none"): as
        vLLM's, such a stream sends no chunk for a delta with nothing to show."""
        return self.reasoning is not None or self.plan.mode != "none"

    def message(self, text: str, finish_reason: str | None, role: str = "assistant"
                ) -> tuple[dict[str, Any], str | None]:
        """The message (of role) of a finished reply, and OpenAI's finish_reason for it."""
        reasoning, rest = self.split(text, True)
        content, calls = self.plan.extract(rest)
        if reasoning is not None and not content:
            content = None  # vLLM's parsers: no text after the thinking span is no content
        # every field of vLLM's ChatMessage, unset ones null (tool_calls an empty list)
        message: dict[str, Any] = {"role": role, "content": content, "refusal": None,
                                   "annotations": None, "audio": None, "function_call": None,
                                   "tool_calls": calls or [], "reasoning": None,
                                   "reasoning_content": None}
        if reasoning is not None and self.include_reasoning:
            message["reasoning_content"] = message["reasoning"] = reasoning
        # vLLM: auto calls read from a whole reply count whatever ended it; required ones
        # only where the engine stopped (not cut off by max_tokens)
        called = bool(calls) and (self.plan.mode == "auto" or finish_reason == "stop")
        return message, self.plan.finish_reason(finish_reason, called)

    def streamer(self) -> ReplyStreamer:
        """A streamer of one choice's deltas."""
        return ReplyStreamer(self)


class ReplyStreamer:
    """One choice's text deltas in, OpenAI chat deltas out: reasoning_content (and vLLM's
    newer `reasoning`) while it thinks, then content and tool_calls."""

    def __init__(self, reply: ReplyFormat) -> None:
        self.reply, self.text = reply, ""
        self.token_ids: list[int] = []  # the reply's tokens so far (for its reasoning count)
        self._reasoning_sent = self._rest_sent = 0
        self.tools = reply.plan.streamer()

    def feed(self, delta: str, final: bool, token_ids: list[int] | tuple = ()) -> dict[str, Any]:
        """The chat delta the new text (of token_ids) makes (empty when it holds nothing to
        send yet)."""
        self.text += delta
        self.token_ids += token_ids
        reasoning, rest = self.reply.split(self.text, final)
        out: dict[str, Any] = {}
        if reasoning is not None and len(reasoning) > self._reasoning_sent:
            if self.reply.include_reasoning:
                out["reasoning_content"] = out["reasoning"] = reasoning[self._reasoning_sent:]
            self._reasoning_sent = len(reasoning)
        content, calls = self.tools.feed(rest[self._rest_sent:], final)
        self._rest_sent = max(self._rest_sent, len(rest))
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = calls
        return out

    def reasoning_tokens(self) -> int | None:
        """The thinking tokens of the reply fed so far (None: no reasoning parser)."""
        return self.reply.reasoning_tokens(self.text, self.token_ids)

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's finish_reason for the choice's last delta ("tool_calls" only where the
        engine stopped, as vLLM's stream: a reply cut off by max_tokens stays "length")."""
        return self.reply.plan.finish_reason(reason, self.tools.called and reason == "stop")


def reasoning_token_count(reasoning: str | None, token_ids: list[int],
                          end_id: int | tuple[int, ...] | None) -> int:
    """How many of the reply's tokens are thinking: up to and including the end tag's token
    or token sequence (all of them while the span is open); 0 without a span or where the
    end tag has no fixed tokens (no token boundary to count to)."""
    if reasoning is None or end_id is None:
        return 0
    end = (end_id,) if isinstance(end_id, int) else end_id
    for at in range(len(token_ids) - len(end) + 1):
        if tuple(token_ids[at:at + len(end)]) == end:
            return at + len(end)
    return len(token_ids)


def reply_params(params: SamplingParams, reply: ReplyFormat, tokenizer,
                 thinking_token_budget: int | None) -> SamplingParams:
    """params with the tool grammar (a 400 when the request asks for another constraint
    too), any grammar gated until the thinking ends, the thinking budget's processor, and
    special tokens kept where the tool parser's markers are special."""
    plan, grammar = reply.plan, reply.plan.grammar()
    if grammar is not None and params.structured_outputs is not None:
        raise OpenAIError(400, f'tool_choice "{plan.mode}" is enforced by a grammar; it cannot '
                          "be combined with response_format or structured_outputs",
                          param="tool_choice")
    params.structured_outputs = grammar or params.structured_outputs
    if plan.parser is not None and not plan.parser.skip_special_tokens:
        params.skip_special_tokens = False
    reasoning = reply.reasoning
    if reasoning is None:
        if thinking_token_budget is not None:
            raise OpenAIError(400, "thinking_token_budget needs a server started with "
                              "--reasoning-parser", param="thinking_token_budget")
        return params
    start_id, end_id = reasoning.token_ids(tokenizer)
    if reasoning.keeps_special_tokens(tokenizer):
        params.skip_special_tokens = False
    if reasoning.may_think and params.structured_outputs is not None:
        gate_end = reasoning.end_ids(tokenizer)  # a token sequence where the family's is fixed
        if gate_end is None:  # no token to wait for: the grammar would forbid the thinking
            raise OpenAIError(400, f"structured outputs and tool grammars start after the "
                              f"thinking span's end, and {reasoning.end!r} is not one token of "
                              "this tokenizer; turn thinking off to use them",
                              param="response_format" if grammar is None else "tool_choice")
        params.structured_outputs = dataclasses.replace(params.structured_outputs,
                                                        reasoning_end_token_id=gate_end)
    if thinking_token_budget is not None:
        params.logits_processors = [*(params.logits_processors or []),
                                    _budget(thinking_token_budget, reasoning, start_id, end_id)]
    return params


def _budget(budget: int, reasoning: ReasoningParser, start_id: int | None,
            end_id: int | None) -> ThinkingBudget:
    if end_id is None:
        raise OpenAIError(400, f"thinking_token_budget: {reasoning.end!r} is not one token of "
                          "this tokenizer", param="thinking_token_budget")
    if budget < 0:
        raise OpenAIError(400, f"thinking_token_budget must be >= 0, got {budget}",
                          param="thinking_token_budget")
    return ThinkingBudget(budget, end_id, start_id, reasoning.starts_thinking)
