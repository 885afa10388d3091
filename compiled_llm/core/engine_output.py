"""What the engine core tells the front end after a step, per request: the new token ids, their
logprob rows, prompt logprob rows, and how the request finished. Plain data, so it crosses a
process boundary as nested tuples (msgpack) without pickling."""

from __future__ import annotations

from dataclasses import dataclass

LogprobRow = tuple[list[int], list[float], int]  # (ids, logprobs, rank of ids[0])


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's news from one step. Invariant: finish_reason is set exactly once, on the
    request's last output; error is set only with finish_reason "error"."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[LogprobRow] | None = None  # one row per new token, when asked for
    prompt_logprobs: list[LogprobRow] | None = None  # rows for prompt positions scored now
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    error: str | None = None
    # prompt tokens served from the prefix cache: on the request's first tokens and its finish
    num_cached_tokens: int | None = None
    # time.monotonic() (system-wide) at its first admission: on the request's first tokens
    scheduled_ts: float | None = None
    # when the core sent it (time.monotonic()), set on arrival; not on the wire in to_wire
    timestamp: float | None = None

    @property
    def finished(self) -> bool:
        """Whether this is the request's last output."""
        return self.finish_reason is not None

    def to_wire(self) -> tuple:
        """The output as a tuple of plain values (msgpack-able)."""
        return (self.request_id, self.new_token_ids, self.new_logprobs, self.prompt_logprobs,
                self.finish_reason, self.stop_reason, self.error, self.num_cached_tokens,
                self.scheduled_ts)

    @staticmethod
    def from_wire(item: list | tuple) -> EngineCoreOutput:
        """The inverse of to_wire (msgpack gives lists for tuples; rows stay lists)."""
        return EngineCoreOutput(*item)
