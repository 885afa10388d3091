"""Steps with speculative decoding over a ModelRunner: one target forward of the flat batch (a
request verifying k drafts has k+1 query tokens, as a prefill chunk does, so piecewise CUDA
graphs cover it), the usual sampling for one-token rows, verification of the drafts
(rejection.py), then the proposer's drafts for the next step. These steps run to the end (step
N+1's drafts need step N's tokens); steps without speculation take the runner's async path."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.spec_decode import ngram_device  # noqa: F401  (registers "ngram")
from compiled_llm.sample.spec_decode.proposers import Proposer, make_proposer
from compiled_llm.sample.spec_decode.rejection import VerifyBatch, verify
from compiled_llm.sample.uploads import upload
from compiled_llm.speculative import SpeculativeConfig, speculative_config_of
from compiled_llm.worker.model_runner import ModelRunner, StepResult

logger = logging.getLogger(__name__)


@dataclass
class SpecStepResult(StepResult):
    """A step's results; `sampled` holds a list (accepted drafts + one) for each request that
    verified drafts, and `drafts` the proposals for the next step."""

    drafts: dict[str, list[int]] = field(default_factory=dict)


def verify_rows(sched: SchedulerOutput, skipped: dict[str, str]
                ) -> list[tuple[Request, int, int]]:
    """(request, first hidden row, number of drafts) of each request verifying drafts: its
    query runs past its known tokens (rows in the order the input batch lays them out)."""
    out, row = [], 0
    for req, num_new in sched.scheduled:
        if req.request_id in skipped:
            continue
        if num_new > 1 and req.num_computed_tokens + num_new > len(req.all_token_ids):
            out.append((req, row, num_new - 1))
        row += num_new
    return out


def state_rows(sched: SchedulerOutput, skipped: dict[str, str], errors: dict[str, str],
               accepted: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    """(first hidden row, rows at positions now computed) of each request in the step that
    did not fail: a verifier's query rows up to its last accepted token, else all of them."""
    out, row = {}, 0
    for req, num_new in sched.scheduled:
        rid = req.request_id
        if rid in skipped:
            continue
        if rid not in errors:
            out[rid] = (row, len(accepted[rid]) if rid in accepted else num_new)
        row += num_new
    return out


def last_hidden(hidden: torch.Tensor, inputs, rows: list[tuple[Request, int, int]],
                accepted: dict[str, list[int]]) -> tuple[list[str], torch.Tensor]:
    """(request ids, [R, hidden]) the target's hidden state at the row that gave each sampling
    request its last token: a verifying request's last accepted position, else its sample
    row (the rows stay on the device)."""
    verified = {req.request_id: first + len(accepted[req.request_id]) - 1
                for req, first, _ in rows if req.request_id in accepted}
    plain = [i for i, req in enumerate(inputs.sample_reqs) if req.request_id not in verified]
    ids = [inputs.sample_reqs[i].request_id for i in plain] + list(verified)
    index = inputs.sample_rows[:len(inputs.sample_reqs)]
    if verified:  # verifying requests need not be sampling rows of the step
        index = torch.cat([index[upload(plain, torch.int64, hidden.device)],
                           upload(list(verified.values()), torch.int64, hidden.device)])
    return ids, hidden.index_select(0, index)


class SpecDecodeRunner:
    """Runs speculative steps on `runner` with `proposer`. Invariant: a request's drafts in a
    verify step are req.spec_token_ids as the scheduler trimmed them (the input batch reads
    the same list), and draft_probs matches them row for row."""

    def __init__(self, runner: ModelRunner, cfg: SpeculativeConfig, proposer: Proposer) -> None:
        self.runner, self.cfg, self.proposer = runner, cfg, proposer

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> SpecStepResult:
        """Run one step to the end: tokens per request, and the next step's drafts."""
        self.proposer.release(sched.finished_req_ids, sched.preempted_req_ids)
        runner = self.runner
        step = runner.launch_forward(sched)
        rows = verify_rows(sched, step.result.skipped)
        hidden, inputs = step.hidden, step.inputs
        accepted = self._verify(hidden, rows, step.result.errors) if rows else {}
        result = runner.finish(runner.launch_sampling(step))
        result.sampled.update(accepted)
        out = SpecStepResult(**{f.name: getattr(result, f.name) for f in fields(result)})
        live = {rid: tokens for rid, tokens in out.sampled.items() if rid not in out.errors}
        if self.proposer.uses_target_hidden and live:
            self.proposer.take_hidden(*last_hidden(hidden, inputs, rows, accepted))
        if self.proposer.uses_target_states:
            self.proposer.take_states(state_rows(sched, step.result.skipped, out.errors,
                                                 accepted), hidden)
        out.drafts = self.proposer.propose(sched, live)
        return out

    def _verify(self, hidden: torch.Tensor, rows: list[tuple[Request, int, int]],
                errors: dict[str, str]) -> dict[str, list[int]]:
        """Accepted drafts + one token per verifying request (errors filled in per request)."""
        index = [first + j for _, first, num in rows for j in range(num + 1)]
        logits = self.runner.model.compute_logits(
            hidden.index_select(0, upload(index, torch.int64, hidden.device)))
        reqs = [req for req, _, num in rows for _ in range(num + 1)]
        meta = self.runner.sampler.prepare(reqs)
        drafts = [req.spec_token_ids[:num] for req, _, num in rows]
        probs = [self.proposer.draft_probs(req.request_id, num) for req, _, num in rows]
        tokens = verify(logits, meta, VerifyBatch.of(drafts, probs))
        for row, err in meta.row_errors.items():
            errors[reqs[row].request_id] = err
        return {req.request_id: toks for (req, _, _), toks in zip(rows, tokens)
                if req.request_id not in errors}


def build_spec_runner(args, worker) -> SpecDecodeRunner | None:
    """The speculative runner of a worker when args.speculative_config is set, else None."""
    cfg = speculative_config_of(args.speculative_config)
    if cfg is None:
        return None
    if cfg.method == "draft_model":
        from compiled_llm.worker import draft_model  # noqa: F401  (registers the proposer)
    if cfg.method == "medusa":
        from compiled_llm.worker import medusa  # noqa: F401  (registers the proposer)
    if cfg.method == "eagle":
        from compiled_llm.worker import eagle  # noqa: F401  (registers the proposer)
    if cfg.method == "eagle3":
        from compiled_llm.worker import eagle3  # noqa: F401  (registers the proposer)
    proposer = make_proposer(cfg, target=worker.runner, args=args,
                             num_blocks=worker.num_blocks)
    logger.info("speculative decoding: %s, %d tokens per step", cfg.method,
                cfg.num_speculative_tokens)
    return SpecDecodeRunner(worker.runner, cfg, proposer)
