"""LLMEngine: wires input processing, the scheduler and KV manager, the executor and output
processing, and runs one step at a time. Requests with n > 1 fan out into n child sequences.
Faults stay contained: an error in one request's processing fails that request alone, a failed
model step fails that step's requests, and the engine goes on serving."""

from __future__ import annotations

import dataclasses
import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# At import, not in _load_tokenizer: importing transformers leaves frames alive in reference
# cycles, and inside LLMEngine.__init__ they would hold the engine until the garbage collector.
from transformers import AutoTokenizer

from compiled_llm.config import EngineArgs
from compiled_llm.core.async_scheduler import AsyncScheduler
from compiled_llm.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput
from compiled_llm.engine.input_processor import InputProcessor, PromptType
from compiled_llm.executor.uniproc_executor import UniProcExecutor
from compiled_llm.output.output_processor import OutputProcessor, request_output
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.loader import load_hf_config, read_json, resolve_dtype
from compiled_llm.worker.model_runner import LaunchedStep, StepResult
from compiled_llm.worker.step_timer import StepStats, StepTimer
from compiled_llm.worker.worker import WorkerSpec

logger = logging.getLogger(__name__)
DEMO_MODEL = Path(__file__).parents[1] / "data" / "demo_model"


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load (read by the server's metrics from any thread)."""

    num_running: int = 0
    num_waiting: int = 0
    num_used_blocks: int = 0
    num_blocks: int = 1
    num_preemptions: int = 0

    @property
    def kv_usage(self) -> float:
        """Fraction of the usable KV blocks (all but the null block) held by requests."""
        return self.num_used_blocks / max(1, self.num_blocks - 1)


def resolve_device(device: str) -> torch.device:
    """The torch device for EngineArgs.device (auto: CUDA when present, else CPU)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def eos_ids(model_dir: str, hf: dict[str, Any], tokenizer) -> tuple[int, ...]:
    """EOS ids from generation_config.json, else config.json, else the tokenizer."""
    gen = read_json(Path(model_dir) / "generation_config.json")
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


class LLMEngine:
    """The engine core: input processing, the scheduler over the KV cache manager, the
    executor's worker, and output processing; `step()` runs one step. Invariant: every
    request the engine accepted finishes (or is aborted) with its KV blocks back in the pool.
    After shutdown() it holds no device memory and refuses add_request and step."""

    _shut_down = False

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        model_dir = str(args.model or DEMO_MODEL)
        torch.manual_seed(args.seed)
        self.device = resolve_device(args.device)
        hf = load_hf_config(model_dir)
        self.dtype = resolve_dtype(args.dtype, hf, self.device)
        self.tokenizer = None if args.skip_tokenizer_init else self._load_tokenizer(model_dir)
        sched_cfg = args.scheduler_config(hf.get("max_position_embeddings", 2048))
        self.max_model_len = sched_cfg.max_model_len
        self.executor = UniProcExecutor(args, WorkerSpec(model_dir, self.dtype, self.device,
                                                         sched_cfg))
        self.startup_seconds = self.executor.startup_seconds
        self.kv = KVCacheManager(self.executor.num_blocks, args.block_size,
                                 args.enable_prefix_caching, args.prefix_caching_hash_algo)
        scheduler_cls = AsyncScheduler if args.async_scheduling else Scheduler
        self.scheduler = scheduler_cls(sched_cfg, self.kv)
        self.outputs = OutputProcessor(self.tokenizer)
        self.eos_token_ids = eos_ids(model_dir, hf, self.tokenizer)
        self.inputs = InputProcessor(self.tokenizer, self.executor.vocab_size,
                                     self.eos_token_ids, self.max_model_len, args)
        self.parents: dict[str, list[Request]] = {}
        self._inflight: tuple[SchedulerOutput, LaunchedStep] | None = None  # async scheduling
        logger.info("engine ready: %s on %s, %d KV blocks", model_dir, self.device,
                    self.executor.num_blocks)
        # Imports done lazily while this engine was built (tokenizer classes, Triton, Inductor)
        # can leave garbage cycles whose frames reach this frame and so the engine: collect
        # them now, so dropping the engine frees it without waiting for the collector.
        gc.collect()

    def _load_tokenizer(self, model_dir: str):
        return AutoTokenizer.from_pretrained(self.args.tokenizer or model_dir)

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}."""
        return self.inputs.tokenize(prompt)

    def add_request(self, request_id: str, prompt: PromptType,
                    params: SamplingParams | None = None, priority: int = 0) -> None:
        """Validate and queue; raises ValueError (naming the field) without side effects."""
        self._check_open()
        if request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        children = self.inputs.process(request_id, prompt, params or SamplingParams(), priority)
        for child in children:
            self.outputs.start(child)
            self.scheduler.add_request(child)
        self.parents[request_id] = children

    def abort_request(self, request_id: str) -> None:
        """Abort a request and its children; unknown or finished ids are ignored."""
        for child in self.parents.pop(request_id, []):
            self.scheduler.abort(child.request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting, running or has a launched step not yet read."""
        return self.scheduler.has_unfinished() or self._inflight is not None

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live requests (cached blocks nobody holds are free)."""
        return self.kv.num_used_blocks

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative prefix-cache hits and queries, in tokens and in blocks."""
        return self.kv.stats

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (blocks held by requests stay theirs)."""
        self.kv.reset_prefix_cache()

    @property
    def model_config(self):
        """The loaded model's config (a DecoderConfig: vocab_size, layers, heads ...)."""
        return self.executor.model_config

    def get_stats(self) -> EngineStats:
        """The engine's load now: running and waiting requests, blocks, preemptions."""
        sched = self.scheduler
        return EngineStats(len(sched.running), len(sched.waiting), self.kv.num_used_blocks,
                           self.kv.pool.num_blocks, sched.num_preemptions)

    # ------------------------------------------------------------------ step
    @property
    def step_stats(self) -> StepStats:
        """A snapshot of the per-step host and device time totals (subtract two for a window)."""
        return dataclasses.replace(self.executor.step_timer.stats)

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and return outputs of requests that progressed
        or failed.

        Under async scheduling (the default) a step launches the next model step and returns
        the outputs of the one launched before it: outputs lag one step, so the first step
        after an idle engine returns no tokens, and has_unfinished_requests() stays true while
        a launched step is unread (keep stepping until it is false). With
        async_scheduling=False each step runs to the end and returns its own outputs."""
        self._check_open()
        timer = self.executor.step_timer
        timer.begin()
        try:
            return self._step_async(timer) if self.args.async_scheduling else self._step(timer)
        finally:
            timer.end()

    def _step(self, timer: StepTimer) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        timer.scheduled()
        if sched.is_empty:
            self.executor.release(sched.finished_req_ids, sched.preempted_req_ids)
            return []
        try:
            result = self.executor.execute(sched)
        except Exception as e:  # the model step: fail its requests, keep serving the rest
            return self._fail_step(sched, e)
        timer.executed()
        skipped = self._fail_skipped(sched, result.skipped)
        self.scheduler.advance(sched)
        return self._process(sched, result, skipped)

    def _step_async(self, timer: StepTimer) -> list[RequestOutput]:
        """Schedule step N+1 and launch it, landing step N (reading its tokens, processing
        them) while the device runs N+1's forward; see _launch_async for the order."""
        sched = self.scheduler.schedule()
        timer.scheduled()
        prev, self._inflight = self._inflight, None
        outs: list[RequestOutput] = []
        if sched.is_empty:
            self.executor.release(sched.finished_req_ids, sched.preempted_req_ids)
        else:
            outs, prev = self._launch_async(sched, prev, timer)
        if prev is not None:
            outs += self._land(prev, timer)
        return outs

    def _launch_async(self, sched: SchedulerOutput,
                      prev: tuple[SchedulerOutput, LaunchedStep] | None, timer: StepTimer
                      ) -> tuple[list[RequestOutput], tuple[SchedulerOutput, LaunchedStep] | None]:
        """Launch N+1's forward; land N now if a sampling row of N+1 needs N's token on the
        host (a grammar, a logits processor); launch N+1's sampling. Returns the outputs so
        far and N when it is still to land (after the sampling, as the device runs)."""
        try:
            step = self.executor.launch_forward(sched, prev[1] if prev else None)
        except Exception as e:
            return self._fail_step(sched, e), prev
        outs = self._collect(self._fail_skipped(sched, step.result.skipped))
        if prev is not None and self.scheduler.must_land_first(step.sample_reqs):
            outs += self._land(prev)
            prev = None
        try:
            self.executor.launch_sampling(step)
        except Exception as e:
            return outs + self._fail_step(sched, e), prev
        timer.gpu_done()
        self.scheduler.advance(sched, step.sample_reqs)
        self._inflight = (sched, step)
        return outs, prev

    def _land(self, inflight: tuple[SchedulerOutput, LaunchedStep],
              timer: StepTimer | None = None) -> list[RequestOutput]:
        """Wait for a launched step and process its results."""
        sched, step = inflight
        try:
            result = self.executor.finish(step)
        except Exception as e:
            return self._fail_step(sched, e)
        if timer is not None:
            timer.executed()
        return self._process(sched, result)

    def _fail_skipped(self, sched: SchedulerOutput, skipped: dict[str, str]) -> list[Request]:
        """Fail the requests the input batch left out of the step (their data cannot run),
        before the step counts as computed: the blocks they were to fill lose their hashes."""
        failed = []
        for req, num_new in sched.scheduled:
            if req.request_id in skipped:
                failed += self.scheduler.fail_step(SchedulerOutput([(req, num_new)]),
                                                   skipped[req.request_id])
        return failed

    def _process(self, sched: SchedulerOutput, result: StepResult,
                 failed: list[Request] = ()) -> list[RequestOutput]:
        """A finished step's results: failures, logprobs, tokens, stop checks, outputs."""
        failed = [*failed, *(self._fail(_scheduled_request(rid, sched), err)
                             for rid, err in result.errors.items())]
        for rid, rows in result.prompt_logprobs.items():
            req = _scheduled_request(rid, sched)
            self._guarded(req, lambda req=req, rows=rows: self.outputs.add_prompt_logprobs(
                req, rows))
        touched = self.scheduler.resolve(sched, result.sampled)
        for req in touched:
            if req.detokenizer is None and req.logprobs is None:
                continue  # no text, no logprobs: nothing to process for this token
            stop = self._guarded(req, lambda req=req: self.outputs.process_token(req, result))
            if stop is not None:  # a stop string beats a length finish on the same token
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED, stop)
        return self._collect(touched + failed)

    def _guarded(self, req: Request, fn):
        """Run one request's host-side processing; an exception fails that request alone."""
        try:
            return fn()
        except Exception as e:
            logger.exception("request %s failed in output processing", req.request_id)
            self._fail(req, f"output processing failed: {type(e).__name__}: {e}")
            return None

    def _fail(self, req: Request, error: str) -> Request:
        """Finish req with FINISHED_ERROR and a message; its blocks go back at once. A request
        that finished in this very step (its last token) is marked failed too."""
        self.scheduler.finish(req, RequestStatus.FINISHED_ERROR, error=error)
        return req

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """The model step raised: fail its requests, keep serving the rest."""
        logger.exception("model step failed; failing its %d requests", len(sched.scheduled),
                         exc_info=exc)
        error = f"model step failed: {type(exc).__name__}: {exc}"
        return self._collect(self.scheduler.fail_step(sched, error))

    def _collect(self, touched: list[Request]) -> list[RequestOutput]:
        """One RequestOutput per user request among touched (children merged), if any news."""
        outs = []
        for parent_id in dict.fromkeys(req.parent_id for req in touched):
            children = self.parents.get(parent_id)
            if children is None:  # aborted meanwhile
                continue
            out = request_output(parent_id, children)
            if out is None:
                continue
            if out.finished:
                del self.parents[parent_id]
            outs.append(out)
        return outs

    # ------------------------------------------------------------------ start-up report
    @property
    def cudagraph_batch_sizes(self) -> list[int]:
        """The batch sizes with a captured whole-model graph ([] without CUDA graphs)."""
        return self.executor.cudagraph_batch_sizes()

    @property
    def cudagraph_capture_seconds(self) -> dict[str, float]:
        """Seconds spent capturing CUDA graphs, per mode (full, piecewise)."""
        return self.executor.cudagraph_capture_seconds()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Abort every request and release the KV cache, step buffers, CUDA graphs, compiled
        code and weights (idempotent); add_request and step raise RuntimeError after."""
        if self._shut_down:
            return
        self._shut_down = True
        for request_id in list(self.parents):
            self.abort_request(request_id)
        self._inflight = None  # a launched step's tensors go with the runner's
        self.inputs.grammars = None
        self.executor.shutdown()

    @property
    def is_shut_down(self) -> bool:
        """True once shutdown() ran."""
        return self._shut_down

    def _check_open(self) -> None:
        """RuntimeError once the engine is shut down."""
        if self._shut_down:
            raise RuntimeError("engine is shut down: build a new one to generate again")


def _scheduled_request(request_id: str, sched: SchedulerOutput) -> Request:
    return next(req for req, _ in sched.scheduled if req.request_id == request_id)
