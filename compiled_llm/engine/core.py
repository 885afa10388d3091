"""EngineCore: the scheduler over the KV cache manager and the executor's worker, stepped one
step at a time; each step reports EngineCoreOutputs (new token ids, logprob rows, finishes).
It runs in the front end's process (LLM) or in a process of its own (core_proc). Faults stay
contained: a failed model step fails that step's requests, and the core goes on serving."""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future

from compiled_llm.config import EngineArgs
from compiled_llm.core.async_scheduler import AsyncScheduler
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput
from compiled_llm.core.spec_scheduler import SpecScheduler
from compiled_llm.core.step_cost import StepCostModel
from compiled_llm.engine.core_types import CoreInfo, EngineStats
from compiled_llm.engine.step_log import StepLog
from compiled_llm.executor import make_executor
from compiled_llm.speculative import speculative_config_of
from compiled_llm.worker.model_runner import LaunchedStep, StepResult
from compiled_llm.worker.spec import WorkerSpec
from compiled_llm.worker.step_timer import StepStats, StepTimer

logger = logging.getLogger(__name__)


class EngineCore:
    """Schedules, launches and collects steps. Invariant: every request added finishes (or is
    aborted) with its KV blocks back in the pool, and each finish is reported exactly once in
    a step's outputs (aborts, which the caller asked for, are not reported)."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, grammars=None) -> None:
        self.spec_config = speculative_config_of(args.speculative_config)
        if self.spec_config is not None and args.async_scheduling and \
                self.spec_config.method != "ngram":
            logger.info("speculative decoding: async scheduling is off (the draft model "
                        "proposes from every step's accepted tokens)")
            args = dataclasses.replace(args, async_scheduling=False)
        self.args = args
        self.executor = make_executor(args, spec)
        self.kv = KVCacheManager(self.executor.num_blocks, args.block_size,
                                 args.enable_prefix_caching, args.prefix_caching_hash_algo)
        # the worker settled max_model_len from the KV cache's size
        sched_cfg = dataclasses.replace(spec.scheduler,
                                        max_model_len=self.executor.max_model_len)
        if self.spec_config is not None:
            self.scheduler = SpecScheduler(sched_cfg, self.kv, *spec_slots(self.spec_config),
                                           self.spec_config.disable_by_batch_size,
                                           pause_when_fruitless=args.async_scheduling)
        else:
            scheduler_cls = AsyncScheduler if args.async_scheduling else Scheduler
            self.scheduler = scheduler_cls(sched_cfg, self.kv)
        self.scheduler.max_loras = args.max_loras if args.enable_lora else 0
        slowdown = sched_cfg.max_decode_slowdown
        self._step_cost = StepCostModel(slowdown) if slowdown else None
        self._last_landing: float | None = None  # when the previous step landed
        self.grammars = grammars  # a callable giving the GrammarManager, built on first use
        self._awaiting_grammar: list[tuple[Request, Future]] = []
        self._inflight: tuple[SchedulerOutput, LaunchedStep] | None = None  # async scheduling
        self._news: dict[str, EngineCoreOutput] = {}
        self._step_log = StepLog.from_env()  # None unless asked for
        ex = self.executor
        self.info = CoreInfo(ex.num_blocks, args.block_size, ex.vocab_size, ex.max_model_len,
                             ex.model_config, ex.startup_seconds, ex.cudagraph_batch_sizes(),
                             ex.cudagraph_capture_seconds())

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Request) -> None:
        """Queue a validated request; ValueError if it can never fit. A request whose grammar
        is still compiling joins the scheduler once it is compiled."""
        spec = req.sampling_params.structured_outputs
        if spec is None or req.grammar is not None:
            self.scheduler.add_request(req)
            return
        self._awaiting_grammar.append((req, self.grammars().prepare(spec)))

    def _admit_compiled(self) -> None:
        """Move requests whose grammar finished compiling into the scheduler."""
        waiting, self._awaiting_grammar = self._awaiting_grammar, []
        for req, future in waiting:
            if not future.done():
                self._awaiting_grammar.append((req, future))
                continue
            try:
                req.grammar = self.grammars().matcher(req.sampling_params.structured_outputs)
                self.scheduler.add_request(req)
            except Exception as exc:  # refused by the compiler (or the pool): this one fails
                self._report(EngineCoreOutput(req.request_id, [], finish_reason="error",
                                              error=str(exc)))

    def abort_requests(self, request_ids) -> None:
        """Abort these requests (unknown or finished ids are ignored); not reported back."""
        ids = set(request_ids)
        self._awaiting_grammar = [(r, f) for r, f in self._awaiting_grammar
                                  if r.request_id not in ids]
        for request_id in ids:
            self.scheduler.abort(request_id)

    def finish_requests(self, finishes) -> None:
        """Finish requests the front end ended: (request id, finish reason, stop reason or
        error) each; a stop string, or an error in output processing."""
        for request_id, reason, detail in finishes:
            req = self.scheduler.requests.get(request_id)
            if req is None:
                continue
            if reason == "error":
                self.scheduler.finish(req, RequestStatus.FINISHED_ERROR, error=detail)
            else:
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED, detail)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting (or compiling), running, or in a launched step."""
        return self.has_steps() or bool(self._awaiting_grammar)

    def has_steps(self) -> bool:
        """Whether a step would schedule or land something (a grammar still compiling aside)."""
        return self.scheduler.has_unfinished() or self._inflight is not None

    def get_stats(self) -> EngineStats:
        """The load now: running and waiting requests, blocks, preemptions, prefix-cache
        lookups."""
        sched, cache = self.scheduler, self.kv.stats
        spec = getattr(sched, "spec_stats", None)
        spec_counts = () if spec is None else (
            spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
            tuple(spec.accepted_per_pos))
        return EngineStats(len(sched.running), len(sched.waiting) + len(self._awaiting_grammar),
                           self.kv.num_used_blocks, self.kv.pool.num_blocks,
                           sched.num_preemptions, cache.queried_tokens, cache.hit_tokens,
                           *spec_counts)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative prefix-cache hits and queries."""
        return self.kv.stats

    @property
    def step_stats(self) -> StepStats:
        """A snapshot of the per-step host and device time totals."""
        return dataclasses.replace(self.executor.step_timer.stats)

    # ------------------------------------------------------------------ step
    def step(self) -> list[EngineCoreOutput]:
        """Schedule, launch and collect one step; the outputs of requests that progressed or
        finished. Under async scheduling (the default) a step launches the next model step
        and returns the tokens of the one launched before it: outputs lag one step, so the
        first step after an idle engine returns no tokens, and has_unfinished() stays true
        while a launched step is unread. With async_scheduling=False each step runs to the
        end and returns its own outputs."""
        if self._awaiting_grammar:
            self._admit_compiled()
        timer = self.executor.step_timer
        timer.begin()
        began = self._step_log.begin() if self._step_log is not None else 0.0
        try:
            if self.spec_config is not None:
                self._step_spec(timer)
            elif self.args.async_scheduling:
                self._step_async(timer)
            else:
                self._step(timer)
        finally:
            timer.end()
            if self._step_log is not None:
                self._step_log.end(began, timer.collected_ms)
        news, self._news = self._news, {}
        return list(news.values())

    def _step(self, timer: StepTimer) -> None:
        sched = self.scheduler.schedule()
        timer.scheduled()
        if sched.is_empty:
            self.executor.release(sched.finished_req_ids, sched.preempted_req_ids)
            self._report_finished()
            return
        try:
            result = self.executor.execute(sched)
        except Exception as e:  # the model step: fail its requests, keep serving the rest
            self._fail_step(sched, e)
            return
        timer.executed()
        self._fail_skipped(sched, result.skipped)
        self.scheduler.advance(sched)
        self._process(sched, result)

    def _step_spec(self, timer: StepTimer) -> None:
        """Speculative decoding: a step that speculates (SpecScheduler.plan_speculation) runs
        synchronously, landing the step in flight first (drafts need its tokens); others run
        without drafts, as async steps when async scheduling is on (n-gram only). The first
        step back proposes, verifying none."""
        self.scheduler.speculating = self.scheduler.plan_speculation()
        if not self.scheduler.speculating and self.args.async_scheduling:
            self._step_async(timer)
            return
        if self._inflight is not None:
            prev, self._inflight = self._inflight, None
            self._land(prev)
        self._step(timer)

    def _step_async(self, timer: StepTimer) -> None:
        """Schedule step N+1 and launch it, landing step N (reading its tokens, processing
        them) while the device runs N+1's forward; see _launch_async for the order."""
        sched = self.scheduler.schedule()
        timer.scheduled()
        prev, self._inflight = self._inflight, None
        if sched.is_empty:
            self.executor.release(sched.finished_req_ids, sched.preempted_req_ids)
        else:
            prev = self._launch_async(sched, prev, timer)
        if prev is not None:
            self._land(prev, timer)
        self._report_finished()

    def _launch_async(self, sched: SchedulerOutput,
                      prev: tuple[SchedulerOutput, LaunchedStep] | None,
                      timer: StepTimer) -> tuple[SchedulerOutput, LaunchedStep] | None:
        """Launch N+1's forward; land N now if a sampling row of N+1 needs N's token on the
        host (a grammar, a logits processor); launch N+1's sampling. Returns N when it is
        still to land (after the sampling, as the device runs)."""
        try:
            step = self.executor.launch_forward(sched, prev[1] if prev else None)
        except Exception as e:
            self._fail_step(sched, e)
            return prev
        self._fail_skipped(sched, step.result.skipped)
        if prev is not None and self.scheduler.must_land_first(step.sample_reqs):
            self._land(prev)
            prev = None
        try:
            self.executor.launch_sampling(step)
        except Exception as e:
            self._fail_step(sched, e)
            return prev
        timer.gpu_done()
        self.scheduler.advance(sched, step.sample_reqs)
        self._inflight = (sched, step)
        return prev

    def _land(self, inflight: tuple[SchedulerOutput, LaunchedStep],
              timer: StepTimer | None = None) -> None:
        """Wait for a launched step and process its results."""
        sched, step = inflight
        try:
            result = self.executor.finish(step)
        except Exception as e:  # counted at launch: its blocks' hashes go too
            self.scheduler.uncount(sched, self._inflight[0] if self._inflight else None)
            self._fail_step(sched, e)
            return
        if timer is not None:
            timer.executed()
        self._process(sched, result)

    def _observe_cost(self, sched: SchedulerOutput) -> None:
        """Feed the step cost model the landed step (its time: since the previous landing,
        when the engine ran steps back to back), and the scheduler its new prefill cap."""
        now = time.monotonic()
        last, self._last_landing = self._last_landing, now
        if not self.scheduler.has_unfinished():
            self._last_landing = None  # idle next: the time until the next landing is not a step
        if last is None:
            return
        decodes = len(sched.scheduled) - sched.num_prefill_reqs
        self._step_cost.observe(decodes, sched.num_prefill_tokens, now - last)
        self.scheduler.prefill_cap = self._step_cost.prefill_cap()

    def _fail_skipped(self, sched: SchedulerOutput, skipped: dict[str, str]) -> None:
        """Fail the requests the input batch left out of the step (their data cannot run),
        before the step counts as computed: the blocks they were to fill lose their hashes."""
        if not skipped:  # the usual step (hot: no pass over its requests)
            return
        for req, num_new in sched.scheduled:
            if req.request_id in skipped:
                self.scheduler.fail_step(SchedulerOutput([(req, num_new)]),
                                         skipped[req.request_id])

    def _process(self, sched: SchedulerOutput, result: StepResult) -> None:
        """A finished step's results: failures, prompt logprobs, tokens and stop checks."""
        if self._step_log is not None:
            self._step_log.landed = sched
        for rid, err in result.errors.items():
            self.scheduler.finish(_scheduled_request(rid, sched), RequestStatus.FINISHED_ERROR,
                                  error=err)
        for rid, rows in result.prompt_logprobs.items():
            req = _scheduled_request(rid, sched)
            req.prompt_logprobs.extend(rows)  # the core counts progress by them
            news = self._news_of(rid)  # two steps may land before an output is taken
            news.prompt_logprobs = rows if news.prompt_logprobs is None else \
                news.prompt_logprobs + rows
        counts = _output_counts(sched) if self.spec_config is not None else None
        for req in self.scheduler.resolve(sched, result.sampled):
            out = self._news_of(req.request_id)
            if counts is None:
                out.new_token_ids.append(req.output_token_ids[-1])
            else:  # speculative decoding: a step may add several tokens
                out.new_token_ids.extend(req.output_token_ids[counts[req.request_id]:])
            if len(out.new_token_ids) == len(req.output_token_ids):  # its first tokens
                out.num_cached_tokens = req.num_cached_tokens
                out.scheduled_ts = req.first_scheduled_time
            row = result.logprobs.get(req.request_id)
            if row is not None:
                if out.new_logprobs is None:
                    out.new_logprobs = []
                out.new_logprobs.append(row)
        drafts = getattr(result, "drafts", None)  # (a step launched async proposes nothing)
        if drafts is not None:
            self.scheduler.set_drafts(drafts)
        self._report_finished()
        if self._step_cost is not None:  # after the stop checks: idle is known
            self._observe_cost(sched)

    def _news_of(self, request_id: str) -> EngineCoreOutput:
        out = self._news.get(request_id)
        if out is None:
            out = self._news[request_id] = EngineCoreOutput(request_id, [])
        return out

    def _report(self, out: EngineCoreOutput) -> None:
        self._news[out.request_id] = out

    def _report_finished(self) -> None:
        """Report every request the scheduler finished (aborts excepted) since the last call."""
        for req in self.scheduler.take_newly_finished():
            if req.status is RequestStatus.FINISHED_ABORTED:
                continue
            out = self._news_of(req.request_id)
            out.num_cached_tokens = req.num_cached_tokens
            out.finish_reason, out.stop_reason = req.finish_reason, req.stop_reason
            out.error = req.error if req.status is RequestStatus.FINISHED_ERROR else None

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> None:
        """The model step raised: fail its requests, keep serving the rest."""
        logger.exception("model step failed; failing its %d requests", len(sched.scheduled),
                         exc_info=exc)
        self.scheduler.fail_step(sched, f"model step failed: {type(exc).__name__}: {exc}")
        self._report_finished()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Abort every request and release the device memory the worker holds (idempotent)."""
        for request_id in list(self.scheduler.requests):
            self.scheduler.abort(request_id)
        self._awaiting_grammar = []
        self._inflight = None  # a launched step's tensors go with the runner's
        self.executor.shutdown()


def spec_slots(cfg) -> tuple[int, int]:
    """(draft tokens per step, lookahead slots) the scheduler reserves for a speculative
    config: a draft model (or EAGLE head) also writes the KV of the drafts it feeds itself."""
    k = cfg.num_speculative_tokens
    return k, (k if cfg.method in ("draft_model", "eagle", "eagle3") else 0)


def _output_counts(sched: SchedulerOutput) -> dict[str, int]:
    return {req.request_id: req.num_output_tokens for req, _ in sched.scheduled}


def _scheduled_request(request_id: str, sched: SchedulerOutput) -> Request:
    return next(req for req, _ in sched.scheduled if req.request_id == request_id)


class InProcCore(EngineCore):
    """The engine core in the front end's process, offering what CoreClient offers."""

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live requests."""
        return self.kv.num_used_blocks

    def step(self, timeout_s: float | None = None):
        """Run one step now (timeout_s is for a core in another process; unused here)."""
        return super().step()

    def add_requests(self, reqs: list[Request]) -> None:
        """Queue validated child requests."""
        for req in reqs:
            self.add_request(req)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash."""
        self.kv.reset_prefix_cache()
