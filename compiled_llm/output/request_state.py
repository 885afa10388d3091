"""RequestState: the front end's view of one sequence: its prompt, the tokens the engine core
reported, its text and logprob records, how it finished, and what stream deltas already
carried. The core's Request holds scheduling state; this holds what the user sees."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from compiled_llm.sampling_params import RequestOutputKind, SamplingParams


@dataclass(eq=False)
class RequestState:
    """One child sequence on the front end. Invariant: finish_reason is set once and never
    changes afterwards; output_token_ids only grows until then."""

    request_id: str
    parent_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    lora_request: Any = None  # the LoRARequest it runs with (its outputs name it, as vLLM's)
    output_token_ids: list[int] = field(default_factory=list)
    detokenizer: Any = None  # incremental, when text is needed while the request runs
    final_text: str | None = None  # text decoded once at the finish (no incremental need)
    logprobs: list[dict] | None = None
    prompt_logprobs: list[dict | None] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    # streaming: how much of the output earlier DELTA outputs already carried
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    final_sent: bool = False
    delta_sent: bool = False  # a DELTA output carried it (its first brings the prompt logprobs)
    # FINAL_ONLY: (stamp, tokens) per step that brought tokens, for the output's metrics
    token_steps: list[tuple[float, int]] | None = None
    scheduled_ts: float | None = None  # when the core first admitted it (time.monotonic())
    arrival_time: float = field(default_factory=time.time)  # vLLM's: add_request's time.time()
    first_token_latency: float | None = None  # seconds from arrival_time to its first token
    queued_ts: float = field(default_factory=time.monotonic)  # vLLM's: when it was queued

    def __post_init__(self) -> None:
        if self.sampling_params.output_kind is RequestOutputKind.FINAL_ONLY:
            self.token_steps = []
        if self.sampling_params.logprobs is not None:
            self.logprobs = []
        if self.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has no logprob

    @property
    def text_while_running(self) -> bool:
        """Whether text is needed before the finish: stop strings, or outputs that carry it
        as it grows (DELTA or CUMULATIVE); else it is decoded once, at the finish."""
        params = self.sampling_params
        return bool(params.stop) or params.output_kind is not RequestOutputKind.FINAL_ONLY

    @property
    def output_text(self) -> str:
        """The detokenized output so far ("" without a tokenizer or detokenization)."""
        if self.detokenizer is not None:
            return self.detokenizer.output_text
        return self.final_text or ""

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """Whether the request has finished (any reason)."""
        return self.finish_reason is not None

    def finish(self, reason: str, stop_reason: int | str | None = None,
               error: str | None = None) -> bool:
        """Record the finish; False (and nothing changes) if it already finished."""
        if self.finish_reason is not None:
            return False
        self.finish_reason, self.stop_reason = reason, stop_reason
        self.error = error if reason == "error" else None
        return True
