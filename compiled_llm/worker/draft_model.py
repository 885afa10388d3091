"""The draft-model proposer: a small model from its own directory on its own ModelRunner, with
its own paged KV cache on a mirrored block table (as many blocks as the target's; a request's
draft K/V live in the block ids the scheduler gave the target, so one allocation, with k slots
of lookahead, covers both). After each target step the draft catches up on the tokens it has
not seen, then runs k - 1 one-token steps: k tokens proposed autoregressively."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.metadata import make_generator
from compiled_llm.sample.sampler import random_sample
from compiled_llm.sample.spec_decode.proposers import (
    Proposer,
    Sampled,
    new_tokens_of,
    register_proposer,
    spec_eligible,
)
from compiled_llm.sample.uploads import upload
from compiled_llm.sampling_params import SAMPLING_EPS, SamplingParams
from compiled_llm.speculative import SpeculativeConfig
from compiled_llm.worker.loader import load_model
from compiled_llm.worker.model_runner import ModelRunner

SHADOW_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)  # the draft runner never samples
_SEED_SALT = 0x5EED  # a seeded request's draft draws: its own stream, apart from the target's


@dataclass
class _Shadow:
    """The draft model's view of one request: a Request the draft runner's input batch reads
    (all_token_ids: the tokens fed so far, block_ids: the target's own list), and how many
    leading positions hold K/V of known (target) tokens."""

    req: Request
    known: int = 0
    kv_tokens: list[int] = field(default_factory=list)  # the token at each written position


@dataclass
class _Job:
    """One request's part of a draft step: its shadow, the first position to compute, and
    whether it proposes (it sampled, allows drafts and has room)."""

    shadow: _Shadow
    start: int
    proposes: bool
    temperature: float = 0.0


def draft_backend(target: ModelRunner, args, head_dim: int) -> str:
    """The attention backend of a draft (or head) of head_dim: the target's, unless the
    engine's setting picks another at that head_dim (auto: torch where Triton cannot)."""
    if args is None or not hasattr(args, "attention_backend_for"):
        return target.attn_backend
    return args.attention_backend_for(target.device.type, head_dim)

@register_proposer("draft_model")
class DraftModelProposer(Proposer):
    """Proposes with a draft model; greedy requests take its argmax (one-hot q), sampled ones
    draw from its temperature-scaled distribution, kept as q for the verifier."""

    def __init__(self, cfg: SpeculativeConfig, target: ModelRunner, args=None,
                 num_blocks: int = 0, **context) -> None:
        super().__init__(cfg)
        self.target = target
        try:
            model = load_model(cfg.model, target.dtype, target.device, target.max_model_len,
                               getattr(args, "load_format", "auto"))
        except ValueError as exc:  # the loader names the target's field ("model: ...")
            raise ValueError(f"speculative_config.model: {exc}") from None
        if model.config.vocab_size != target.model.config.vocab_size:
            raise ValueError(f"speculative_config.model: the draft's vocab_size "
                             f"{model.config.vocab_size} differs from the target's "
                             f"{target.model.config.vocab_size}")
        extra = target.max_num_seqs * (self.k + 1)  # catch-up tokens beyond the target's
        self.runner = ModelRunner(model, target.device, target.dtype, target.cache_cfg,
                                  target.compile_cfg, target.max_model_len,
                                  draft_backend(target, args, model.config.head_dim),
                                  target.max_num_seqs, target.max_num_batched_tokens + extra)
        check_room(self.runner, num_blocks)
        self.runner.allocate_kv_cache(num_blocks)  # mirrored: the target's block ids
        self.runner.execute_dummy(1, 1)
        self.runner.capture_cudagraphs()
        self.shadows: dict[str, _Shadow] = {}
        self.probs: dict[str, list[torch.Tensor]] = {}  # request id -> q of each draft [V]
        self.generators: dict[str, torch.Generator] = {}
        self._released: tuple[set[str], set[str]] = (set(), set())

    def release(self, finished: set[str], preempted: set[str]) -> None:
        """Drop shadows (their table rows go with the next draft step)."""
        for request_id in (*finished, *preempted):
            self.shadows.pop(request_id, None)
            self.probs.pop(request_id, None)
        for request_id in finished:
            self.generators.pop(request_id, None)
        done, stopped = self._released
        self._released = (done | set(finished), stopped | set(preempted))

    def draft_probs(self, request_id: str, num: int) -> torch.Tensor | None:
        """q of the request's first num drafts (None: drawn greedily, one-hot)."""
        rows = self.probs.get(request_id)
        return None if rows is None else torch.stack(rows[:num])

    @torch.inference_mode()
    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Catch the draft up on this step's tokens, then propose k tokens per request."""
        jobs = [job for req, num_new in sched.scheduled
                if (job := self._job(req, num_new, sampled.get(req.request_id))) is not None]
        self.probs = {}
        if not jobs:
            return {}
        drafts: dict[str, list[int]] = {}
        items = [(job.shadow.req, len(job.shadow.req.all_token_ids) - job.start) for job in jobs]
        for job in jobs:
            job.shadow.req.num_computed_tokens = job.start
        proposing = [job for job in jobs if job.proposes]
        logits = self._forward(items, proposing)
        for step in range(self.k):
            if not proposing:
                break
            self._draw(proposing, logits, drafts)
            proposing = [job for job in proposing if self._fits(job.shadow.req)]
            if step + 1 < self.k and proposing:
                logits = self._feed(proposing, drafts)
        for job in jobs:
            shadow = job.shadow
            shadow.kv_tokens = list(shadow.req.all_token_ids[:shadow.req.num_computed_tokens])
        return drafts

    def _job(self, req: Request, num_new: int, new: int | list[int] | None) -> _Job | None:
        """This step's draft work for one scheduled request (None: nothing to compute)."""
        shadow = self.shadows.get(req.request_id)
        if shadow is None:  # new, or preempted: trust mirrored K/V below its start
            shadow = self.shadows[req.request_id] = _Shadow(
                Request(req.request_id, [], SHADOW_PARAMS), req.num_computed_tokens)
            shadow.kv_tokens = list(req.all_token_ids[:req.num_computed_tokens])
        tokens = req.all_token_ids + ([] if new is None else new_tokens_of(new))
        end = len(tokens) if new is not None else req.num_computed_tokens + num_new
        shadow.known = _common_prefix(shadow.kv_tokens, tokens, shadow.known)
        start = min(shadow.known, end - 1) if new is not None else shadow.known
        end = min(end, len(req.block_ids) * self.runner.cache_cfg.block_size)
        shadow.req.block_ids = req.block_ids  # the same list: the table rows follow it
        shadow.req.all_token_ids = tokens[:end]
        if start >= end:
            return None
        shadow.known = end
        proposes = new is not None and end == len(tokens) and spec_eligible(req)
        if proposes:
            self.track_seed(req)
        return _Job(shadow, start, proposes, req.sampling_params.temperature)

    def _fits(self, req: Request) -> bool:
        """Whether the next drafted token's K/V has a slot (held blocks, max_model_len)."""
        position = len(req.all_token_ids)
        return (position < len(req.block_ids) * self.runner.cache_cfg.block_size
                and position < self.runner.max_model_len - 1)

    def _forward(self, items: list[tuple[Request, int]], proposing: list[_Job]
                 ) -> torch.Tensor | None:
        """Run the draft over items; logits of the proposing jobs' last tokens, in order."""
        finished, preempted = self._released
        self._released = (set(), set())
        step = self.runner.launch_forward(SchedulerOutput(items, finished, preempted))
        for req, count in items:
            req.num_computed_tokens += count
        if not proposing:
            return None
        rows = {req.request_id: i for i, req in enumerate(step.inputs.sample_reqs)}
        index = [rows[job.shadow.req.request_id] for job in proposing]
        hidden = step.hidden.index_select(0, step.inputs.sample_rows)
        return self.runner.model.compute_logits(hidden[index]).float()

    def _feed(self, proposing: list[_Job], drafts: dict[str, list[int]]) -> torch.Tensor:
        """One draft step over each proposing request's newest draft token."""
        for job in proposing:
            job.shadow.req.all_token_ids.append(drafts[job.shadow.req.request_id][-1])
        return self._forward([(job.shadow.req, 1) for job in proposing], proposing)

    def _draw(self, jobs: list[_Job], logits: torch.Tensor, drafts: dict[str, list[int]]
              ) -> None:
        """Each job's next draft: argmax for greedy requests, else a draw from softmax(l/T)
        whose probabilities are kept for verification (one host read for the batch)."""
        tokens = logits.argmax(dim=-1)
        rows = [i for i, job in enumerate(jobs) if job.temperature >= SAMPLING_EPS]
        if rows:
            device = logits.device
            index = upload(rows, torch.int64, device)
            temperature = upload([jobs[i].temperature for i in rows], torch.float32, device)
            probs = torch.softmax(logits.index_select(0, index) / temperature[:, None], dim=-1)
            generators = {row: gen for row, i in enumerate(rows)
                          if (gen := self._generator(jobs[i])) is not None}
            tokens[index] = random_sample(probs.clone(), generators)
            for row, i in enumerate(rows):
                self.probs.setdefault(jobs[i].shadow.req.request_id, []).append(probs[row])
        for job, token in zip(jobs, tokens.tolist()):
            drafts.setdefault(job.shadow.req.request_id, []).append(token)

    def _generator(self, job: _Job) -> torch.Generator | None:
        """The request's own draft stream when it has a seed (None: the global one)."""
        return self.generators.get(job.shadow.req.request_id)

    def track_seed(self, req: Request) -> None:
        """Give a seeded request its own draft stream."""
        seed = req.sampling_params.seed
        if seed is not None and req.request_id not in self.generators:
            self.generators[req.request_id] = make_generator(seed ^ _SEED_SALT,
                                                             self.runner.device)


def check_room(runner: ModelRunner, num_blocks: int) -> None:
    """ValueError naming the field when the draft's KV cache cannot fit the free device memory
    (its weights and cache come on top of the target's budget)."""
    if runner.device.type != "cuda":
        return
    need = num_blocks * runner.kv_bytes_per_block()
    free = torch.cuda.mem_get_info(runner.device)[0]
    if need > free:
        raise ValueError(f"speculative_config.model: the draft's KV cache needs {need >> 20} MiB "
                         f"for the target's {num_blocks} blocks; {free >> 20} MiB are free. "
                         "Lower gpu_memory_utilization or set kv_cache_memory_bytes")


def _common_prefix(have: list[int], want: list[int], start: int) -> int:
    """Length of the common prefix of have and want, known to be at least start."""
    end = min(len(have), len(want))
    pos = min(start, end)
    while pos < end and have[pos] == want[pos]:
        pos += 1
    return pos
