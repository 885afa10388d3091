"""Draft proposers: after a step, each proposes up to k tokens per request for the next step.
One interface and a registry by speculative_config.method; the host n-gram (prompt lookup)
proposer is here (registered with the device one, ngram_device.py), the draft model's lives
with the worker (it runs a model of its own)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.speculative import SpeculativeConfig

Sampled = dict[str, "int | list[int]"]  # request id -> its token, or accepted drafts + one


class Proposer:
    """Proposes draft tokens. Invariant: a draft list is at most num_speculative_tokens long,
    and draft_probs gives the distribution each draft was drawn from (None: deterministic).
    A proposer with uses_target_hidden gets take_hidden before each propose, one with
    uses_target_states take_states (every computed position's hidden state)."""

    uses_target_hidden = False
    uses_target_states = False

    def __init__(self, cfg: SpeculativeConfig, **context) -> None:
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens

    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Drafts for the requests that sampled in this step, after its tokens."""
        raise NotImplementedError

    def draft_probs(self, request_id: str, num: int) -> torch.Tensor | None:
        """[num, V] probabilities the request's current drafts were drawn from (None: one-hot)."""
        return None

    def take_hidden(self, request_ids: list[str], hidden: torch.Tensor) -> None:
        """The target's last hidden state [R, hidden] of each request that sampled."""

    def take_states(self, rows: dict[str, tuple[int, int]], hidden: torch.Tensor) -> None:
        """The target's hidden states [T, hidden] of the step, and per request (first row,
        number of its rows at computed positions: accepted ones only, for a verifier)."""

    def release(self, finished: set[str], preempted: set[str]) -> None:
        """Forget the state of finished and preempted requests."""


PROPOSERS: dict[str, Callable[..., Proposer]] = {}


def register_proposer(method: str):
    """Class decorator: the proposer of speculative_config.method `method`."""
    def wrap(cls):
        PROPOSERS[method] = cls
        return cls
    return wrap


def make_proposer(cfg: SpeculativeConfig, **context) -> Proposer:
    """The proposer of cfg.method, given what it needs (the target runner, for a draft model)."""
    return PROPOSERS[cfg.method](cfg, **context)


def spec_eligible(req: Request) -> bool:
    """Whether req's sampling allows drafts: its target distribution must not depend on
    host-side feedback or per-token state (logprobs rows, processors, grammars, penalties,
    min_tokens still banning stops). Other requests decode one token per step as usual."""
    params = req.sampling_params
    return (params.logprobs is None and not params.logits_processors
            and params.structured_outputs is None and not params.presence_penalty
            and not params.frequency_penalty and params.repetition_penalty == 1.0
            and req.num_output_tokens >= params.min_tokens)


def new_tokens_of(tokens: int | list[int]) -> list[int]:
    """A step's tokens of one request as a list."""
    return [tokens] if isinstance(tokens, int) else tokens


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The k tokens that followed the latest earlier occurrence of the longest suffix n-gram
    (min_n <= n <= max_n) of tokens; fewer near the end, none without a match. One pass over
    the tokens finds where the last token occurred before; only those candidates are
    extended backwards (a token at a time, at most max_n - 1 times)."""
    last = len(tokens) - 1
    ends = np.flatnonzero(tokens[:last] == tokens[last])  # candidate ends of a match
    best, size = -1, 1
    while len(ends):
        if size >= min_n:
            best = int(ends[-1])  # the latest candidate matching `size` tokens
        if size == max_n:
            break
        ends = ends[ends >= size]
        ends = ends[tokens[ends - size] == tokens[last - size]]
        size += 1
    return [] if best < 0 else tokens[best + 1:best + 1 + k].tolist()


class _History:
    """A request's known tokens as a growing int64 array (requests only ever append)."""

    def __init__(self, req: Request) -> None:
        self.req, self.length = req, 0
        self.tokens = np.empty(max(64, 2 * len(req.all_token_ids)), dtype=np.int64)

    def extend(self, new: list[int]) -> np.ndarray:
        """The request's tokens and new after it, with what it had not seen copied in."""
        known = self.req.all_token_ids
        end = len(known) + len(new)
        if end > len(self.tokens):
            grown = np.empty(2 * end, dtype=np.int64)
            grown[:self.length] = self.tokens[:self.length]
            self.tokens = grown
        if self.length < len(known):
            self.tokens[self.length:len(known)] = known[self.length:]
        self.tokens[len(known):end] = new
        self.length = len(known)  # new tokens are not known yet: rewritten next time
        return self.tokens[:end]


class NgramProposer(Proposer):
    """Prompt lookup: drafts copied from where the sequence's suffix occurred before (on the
    host, from the known tokens kept as arrays between steps; deterministic, so its drafts'
    q is one-hot). Histories of requests missing from a step's schedule are dropped."""

    def __init__(self, cfg: SpeculativeConfig, **context) -> None:
        super().__init__(cfg)
        self.histories: dict[str, _History] = {}

    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Drafts for the requests that sampled in this step, after its tokens."""
        cfg, drafts, histories = self.cfg, {}, {}
        for req, _ in sched.scheduled:
            new = sampled.get(req.request_id)
            if new is None or req.is_finished or not spec_eligible(req):
                continue
            history = self.histories.get(req.request_id)
            if history is None or history.req is not req:
                history = _History(req)
            histories[req.request_id] = history
            proposal = ngram_propose(history.extend(new_tokens_of(new)),
                                     cfg.prompt_lookup_min, cfg.prompt_lookup_max, self.k)
            if proposal:
                drafts[req.request_id] = proposal
        self.histories = histories
        return drafts

