"""Request: the single source of truth for one sequence's state, from arrival to finish.

Tokens, progress (num_computed_tokens), KV blocks, status and the grammar matcher live here;
the scheduler and KV manager read and update this one object. What the user sees (text,
logprob records, stream offsets) lives on the front end's RequestState.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from compiled_llm.lora.request import LoRARequest
from compiled_llm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is in its life; the value of a finished status is its finish_reason."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        """Whether this status ends the request (stop, length, abort or error)."""
        # by value: a str hash is C-level, an Enum member's is Python (hot: every request, step)
        return self._value_ in _FINISHED


_FINISHED = frozenset({"stop", "length", "abort", "error"})


@dataclass(eq=False)
class Request:
    """One sequence. Invariant: num_computed_tokens <= num_tokens, and the first
    num_computed_tokens tokens have their K/V in the blocks listed in block_ids. Under async
    scheduling num_tokens also counts the num_pending tokens that launched steps will sample
    but the host has not read yet (they are not in all_token_ids)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    parent_id: str = ""  # the user's request id when n > 1 fans out into children
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # prompt tokens its first admission took from the prefix cache (-1: not admitted yet);
    # a recompute after preemption does not change it (vLLM's RequestOutput.num_cached_tokens)
    num_cached_tokens: int = -1
    first_scheduled_time: float | None = None  # time.monotonic() at its first admission
    num_pending: int = 0  # sampled by launched steps, not yet appended
    pending_src: int = -1  # row of the newest pending token in its step's sampled tensor
    needs_feedback: bool = False  # sampling reads the previous token on the host
    block_ids: list[int] = field(default_factory=list)
    # prefix caching: hashes of the full blocks of all_token_ids (filled in by the KV manager)
    block_hashes: list[bytes] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    error: str | None = None
    num_preemptions: int = 0
    # prompt logprob rows produced so far (progress through the prompt; the front end decodes)
    prompt_logprobs: list | None = None
    # structured outputs: an xgrammar GrammarMatcher while the request is unfinished
    grammar: Any = None
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base model)
    # vLLM's cache_salt: mixed into the first block's hash, so that only requests with the
    # same salt share prefix-cache blocks (None: no salt)
    cache_salt: str | None = None
    # LongRoPE: the prompt is longer than the original length, so every position reads the
    # long-factor RoPE rows (its K/V differ from a shorter prompt's: it joins the block hash)
    long_rope: bool = False
    # Phi-3's rule (transformers recomputes the cache there): the position at which a shorter
    # prompt's request turns long_rope and recomputes its K/V (None: it never does)
    long_rope_at: int | None = None
    # vLLM's primary EOS: the tokenizer's, first of eos_token_ids, finishing with stop_reason
    # None; without a tokenizer EOS every EOS id is a stop token reported by its id
    tokenizer_eos: bool = True
    # speculative decoding: draft tokens proposed for the next step (never in all_token_ids
    # and never hashed; the scheduler trims them to what fits and verifies them in one step)
    spec_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        self.needs_feedback = self.sampling_params.needs_host_feedback
        if self.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has no logprob

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens, pending ones (sampled, not yet read) included."""
        return len(self.all_token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens the host has read."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """Whether the scheduler has finished this request."""
        return self.status.finished

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs are produced once, on the first pass over the prompt."""
        scored = self.prompt_logprobs
        return scored is not None and len(scored) < self.num_prompt_tokens

    @property
    def skips_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position's hidden state, so a request still owing
        them recomputes its prompt rather than reuse cached blocks."""
        return self.needs_prompt_logprobs

    def append_token(self, token_id: int) -> None:
        """Record a generated token the host has read."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def finish_reason(self) -> str | None:
        """"stop", "length", "abort" or "error" once finished, else None."""
        return self.status.value if self.status.finished else None
