"""Public result types, shaped like vLLM's: RequestOutput, CompletionOutput, Logprob."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def finished(self) -> bool:
        """Whether the sequence has a finish_reason (vLLM's API)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What a request produced so far: its prompt and one CompletionOutput per sequence;
    error is set when a sequence finished with finish_reason "error". num_cached_tokens: the
    prompt tokens its first sequence took from the prefix cache (vLLM's). metrics stays an
    empty dict: per-request timings are not recorded (LLM.get_metrics has engine counters)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None
    num_cached_tokens: int | None = None
