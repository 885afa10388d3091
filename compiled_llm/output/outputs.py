"""Public result types, shaped like vLLM's: RequestOutput, CompletionOutput, Logprob; and
merge_deltas, which joins two DELTA outputs of one request (of one or several sequences)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class Logprob:
    """One token's log probability, its 1-based vocab rank, and its text when decoded."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One generated sequence of a request (a delta of it when streaming DELTA outputs)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    lora_request: Any = None  # vLLM's field: it leaves it None here too

    def finished(self) -> bool:
        """Whether the sequence has a finish_reason (vLLM's API)."""
        return self.finish_reason is not None


@dataclass
class RequestStateStats:
    """A finished request's timings (vLLM's RequestOutput.metrics), time.monotonic() stamps:
    when the core first admitted it, and for a FINAL_ONLY request, whose single output hides
    them, when its tokens reached the front end: its first and last, and (stamp, tokens) per
    step that brought tokens, in time order (token_steps None for other output kinds)."""

    num_generation_tokens: int = 0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    token_steps: list[tuple[float, int]] | None = None
    scheduled_ts: float | None = None
    arrival_time: float = 0.0  # vLLM's: time.time() when the request was added
    first_token_latency: float = 0.0  # vLLM's: seconds from arrival_time to the first token
    queued_ts: float = 0.0  # vLLM's: time.monotonic() when the engine took it in


@dataclass
class RequestOutput:
    """What a request produced so far: its prompt and one CompletionOutput per sequence, in
    vLLM's field order (positional construction as vLLM's); error is set when a sequence
    finished with finish_reason "error". num_cached_tokens: the prompt tokens its first
    sequence took from the prefix cache. metrics: the timings (RequestStateStats) of a
    finished output, else None. lora_request: the adapter it ran with (None: the base model);
    encoder_prompt and encoder_prompt_token_ids: None (decoder-only models)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestStateStats | None = None
    lora_request: Any = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's keyword: no KV transfer here
    error: str | None = None
    # vLLM's keyword: where a prompt's images and the like sit; none in a text prompt
    multi_modal_placeholders: dict[str, Any] = field(default_factory=dict)

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """vLLM's merge of a later output of the same request into this one: per completion
        index, appended (aggregate, DELTA outputs) or replaced; a new index joins."""
        self.finished |= next_output.finished
        for nxt in next_output.outputs:
            i = next((i for i, o in enumerate(self.outputs) if o.index == nxt.index), None)
            if i is None:
                self.outputs.append(nxt)
            elif aggregate:
                merged = append_completion(self.outputs[i], nxt)
                if not nxt.logprobs:  # vLLM keeps what it had when the delta brings none
                    merged.logprobs = self.outputs[i].logprobs
                self.outputs[i] = merged
            else:
                self.outputs[i] = nxt


def merge_deltas(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """b appended to a: texts, tokens and logprobs concatenated per completion index (vLLM's
    RequestOutput.add: a sequence only b carries joins); the prompt logprobs that a's first
    delta carried, and an error either carried, are kept."""
    by_index = {o.index: o for o in a.outputs}
    for o in b.outputs:
        prev = by_index.get(o.index)
        by_index[o.index] = o if prev is None else append_completion(prev, o)
    return replace(b, outputs=[by_index[i] for i in sorted(by_index)],
                   prompt_logprobs=b.prompt_logprobs or a.prompt_logprobs,
                   error=b.error or a.error)


def append_completion(prev: CompletionOutput, delta: CompletionOutput) -> CompletionOutput:
    """A new CompletionOutput: prev with the delta of the same sequence appended."""
    lps = None if delta.logprobs is None else (prev.logprobs or []) + delta.logprobs
    return replace(delta, text=prev.text + delta.text, token_ids=prev.token_ids + delta.token_ids,
                   logprobs=lps)
