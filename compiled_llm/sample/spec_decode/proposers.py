"""Draft proposers: after a step, each proposes up to k tokens per request for the next step.
One interface and a registry by speculative_config.method; the n-gram (prompt lookup) proposer
is here, the draft model's lives with the worker (it runs a model of its own)."""

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
    and draft_probs gives the distribution each draft was drawn from (None: deterministic)."""

    def __init__(self, cfg: SpeculativeConfig, **context) -> None:
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens

    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Drafts for the requests that sampled in this step, after its tokens."""
        raise NotImplementedError

    def draft_probs(self, request_id: str, num: int) -> torch.Tensor | None:
        """[num, V] probabilities the request's current drafts were drawn from (None: one-hot)."""
        return None

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
    (min_n <= n <= max_n) of tokens; fewer near the end, none without a match."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


@register_proposer("ngram")
class NgramProposer(Proposer):
    """Prompt lookup: drafts copied from where the sequence's suffix occurred before (on the
    host, from the known tokens; deterministic, so its drafts' q is one-hot)."""

    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Drafts for the requests that sampled in this step, after its tokens."""
        cfg, drafts = self.cfg, {}
        for req, _ in sched.scheduled:
            new = sampled.get(req.request_id)
            if new is None or req.is_finished or not spec_eligible(req):
                continue
            tokens = np.asarray(req.all_token_ids + new_tokens_of(new), dtype=np.int64)
            proposal = ngram_propose(tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max,
                                     self.k)
            if proposal:
                drafts[req.request_id] = proposal
        return drafts
