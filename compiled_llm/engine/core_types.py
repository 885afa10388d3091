"""What an engine core reports to its front end, as plain data: its load (EngineStats) and
what it built at start-up (CoreInfo). Apart from the core so that a front end whose core runs
in another process reads them without importing the core's stack (the worker, the compiler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiled_llm.core.request import Request


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load (read by the server's metrics from any thread)."""

    num_running: int = 0
    num_waiting: int = 0
    num_used_blocks: int = 0
    num_blocks: int = 1
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache so far
    prefix_cache_hits: int = 0  # of those, tokens served from it
    # speculative decoding (vLLM's spec_decode counters): verify steps, drafts, accepted drafts
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()  # accepted drafts by position in the draft

    @property
    def kv_usage(self) -> float:
        """Fraction of the usable KV blocks (all but the null block) held by requests."""
        return self.num_used_blocks / max(1, self.num_blocks - 1)


@dataclass(frozen=True)
class CoreInfo:
    """What a core built at start-up, as its front end needs it (plain data: it crosses to
    the front end's process as it is)."""

    num_blocks: int  # KV blocks in the pool, the null block included
    block_size: int
    vocab_size: int
    max_model_len: int  # as the worker settled it from the KV cache's size
    model_config: Any
    startup_seconds: dict[str, float]
    cudagraph_batch_sizes: list[int]
    cudagraph_capture_seconds: dict[str, float]

    def check_fits(self, reqs: list[Request]) -> None:
        """ValueError if a request's prompt can never fit the KV cache (the null block
        aside), the check the scheduler makes, made before anything is queued."""
        for req in reqs:
            if -(-(req.num_prompt_tokens + 1) // self.block_size) > self.num_blocks - 1:
                raise ValueError(f"prompt of {req.num_prompt_tokens} tokens can never fit the "
                                 "KV cache")
