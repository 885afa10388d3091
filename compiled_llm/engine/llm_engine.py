"""LLMEngine: wires tokenizer, scheduler, KV manager, runner and output processing, and runs
one step at a time. Requests with n > 1 fan out into n child sequences. Faults stay contained:
an error in one request's processing fails that request alone, a failed model step fails that
step's requests, and the engine goes on serving."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

# At import, not in _load_tokenizer: importing transformers leaves frames alive in reference
# cycles, and inside LLMEngine.__init__ they would hold the engine until the garbage collector.
from transformers import AutoTokenizer

from compiled_llm.config import EngineArgs
from compiled_llm.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput
from compiled_llm.output.output_processor import OutputProcessor, request_output
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sample.structured_outputs import GrammarManager
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.loader import load_hf_config, load_model, read_json, resolve_dtype
from compiled_llm.worker.model_runner import LaunchedStep, ModelRunner, StepResult, num_kv_blocks
from compiled_llm.worker.step_timer import StepStats, StepTimer

logger = logging.getLogger(__name__)
DEMO_MODEL = Path(__file__).parents[1] / "data" / "demo_model"


def resolve_device(device: str) -> torch.device:
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
    """One model on one device: requests in, RequestOutputs out, a step at a time. After
    shutdown() it holds no device memory and refuses add_request and step."""

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
        t0 = time.perf_counter()
        baseline = torch.cuda.memory_allocated() if self.device.type == "cuda" else 0
        model = load_model(model_dir, self.dtype, self.device, sched_cfg.max_model_len,
                           args.load_format, args.quantization)
        t1 = time.perf_counter()
        self.runner = ModelRunner(model, self.device, self.dtype, args.cache_config(),
                                  args.compile_config(), sched_cfg.max_model_len,
                                  args.attention_backend_for(self.device.type),
                                  sched_cfg.max_num_seqs, sched_cfg.max_num_batched_tokens)
        # the profiling forward is also the first call: Dynamo, passes and Inductor run here
        num_blocks = num_kv_blocks(self.runner, sched_cfg.max_num_batched_tokens,
                                   sched_cfg.max_model_len, baseline)
        t2 = time.perf_counter()
        self.runner.allocate_kv_cache(num_blocks)
        self.runner.execute_dummy(1, 1)  # the decode shape
        t3 = time.perf_counter()
        self.runner.capture_cudagraphs(sched_cfg.max_num_seqs)
        self.startup_seconds = {"load": t1 - t0, "compile_and_profile": t2 - t1,
                                "warmup": t3 - t2, "cudagraphs": time.perf_counter() - t3}
        self.kv = KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching,
                                 args.prefix_caching_hash_algo)
        self.scheduler = Scheduler(sched_cfg, self.kv)
        self.outputs = OutputProcessor(self.tokenizer)
        self.eos_token_ids = eos_ids(model_dir, hf, self.tokenizer)
        self.parents: dict[str, list[Request]] = {}
        self.grammars: GrammarManager | None = None
        self._inflight: tuple[SchedulerOutput, LaunchedStep] | None = None  # async scheduling
        logger.info("engine ready: %s on %s, %d KV blocks", model_dir, self.device, num_blocks)

    def _load_tokenizer(self, model_dir: str):
        return AutoTokenizer.from_pretrained(self.args.tokenizer or model_dir)

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}."""
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a text prompt needs a tokenizer")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            vocab = self.runner.model.config.vocab_size
            if not prompt or any(t < 0 or t >= vocab for t in prompt):
                raise ValueError(f"prompt_token_ids must be non-empty ids in [0, {vocab})")
            return None, prompt
        raise ValueError(f"prompt must be a str or a list of token ids, got {type(prompt)}")

    def add_request(self, request_id: str, prompt: str | list[int] | dict,
                    params: SamplingParams | None = None, priority: int = 0) -> None:
        """Validate and queue; raises ValueError (naming the field) without side effects."""
        self._check_open()
        if request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = params or SamplingParams()
        self._check_priority(priority)
        text, ids = self.tokenize(prompt)
        children = [self._child(request_id, i, text, ids, params, priority)
                    for i in range(params.n)]
        for c in children:  # check all before queueing any
            self._check_fits(c)
        if params.structured_outputs is not None:
            self._attach_grammars(children, params.structured_outputs)
        for c in children:
            self.outputs.start(c)
            self.scheduler.add_request(c)
        self.parents[request_id] = children

    def _child(self, rid: str, i: int, text, ids, params: SamplingParams, priority) -> Request:
        p = params
        if params.n > 1:
            p = params.clone()
            p.n = 1
            if p.seed is not None:
                p.seed += i
            if i > 0:
                p.prompt_logprobs = None
        cid = rid if params.n == 1 else f"{i}_{rid}"
        return Request(cid, list(ids), p, self.eos_token_ids, text, priority=priority,
                       parent_id=rid)

    def _check_priority(self, priority: int) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if priority != 0 and self.args.scheduling_policy != "priority":
            raise ValueError(f"priority={priority} needs scheduling_policy='priority' "
                             f"(the engine uses {self.args.scheduling_policy!r})")

    def _check_fits(self, req: Request) -> None:
        if req.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt is {req.num_prompt_tokens} tokens, max_model_len is "
                f"{self.max_model_len}; the prompt plus output must fit"
            )

    def _attach_grammars(self, children: list[Request], spec) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer")
        if self.grammars is None:  # built on first use: costly for large vocabularies
            self.grammars = GrammarManager(self.tokenizer, self.runner.model.config.vocab_size,
                                           self.eos_token_ids)
        self.grammars.compile(spec)  # raises ValueError before any child gets a matcher
        for c in children:
            c.grammar = self.grammars.matcher(spec)

    def abort_request(self, request_id: str) -> None:
        for c in self.parents.pop(request_id, []):
            self.scheduler.abort(c.request_id)

    def has_unfinished_requests(self) -> bool:
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
        self.kv.reset_prefix_cache()

    # ------------------------------------------------------------------ step
    @property
    def step_stats(self) -> StepStats:
        """A snapshot of the per-step host and device time totals (subtract two for a window)."""
        return dataclasses.replace(self.runner.step_timer.stats)

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and return outputs of requests that progressed
        or failed."""
        self._check_open()
        timer = self.runner.step_timer
        timer.begin()
        try:
            return self._step_async(timer) if self.args.async_scheduling else self._step(timer)
        finally:
            timer.end()

    def _step(self, timer: StepTimer) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        timer.scheduled()
        if sched.is_empty:
            self.runner.release(sched.finished_req_ids, sched.preempted_req_ids)
            return []
        try:
            result = self.runner.execute(sched)
        except Exception as e:  # the model step: fail its requests, keep serving the rest
            return self._fail_step(sched, e)
        timer.executed()
        self.scheduler.advance(sched)
        return self._process(sched, result)

    def _step_async(self, timer: StepTimer) -> list[RequestOutput]:
        """Launch step N+1, then read step N's tokens while the device runs N+1. Requests whose
        sampling needs their previous token on the host make N land before N+1 is scheduled."""
        outs: list[RequestOutput] = []
        if self._inflight is not None and any(r.needs_feedback for r in self.scheduler.running):
            outs, self._inflight = self._land(self._inflight), None
        sched = self.scheduler.schedule()
        timer.scheduled()
        prev, self._inflight = self._inflight, None
        if sched.is_empty:
            self.runner.release(sched.finished_req_ids, sched.preempted_req_ids)
        else:
            try:
                step = self.runner.launch(sched, prev[1] if prev else None)
            except Exception as e:
                outs += self._fail_step(sched, e)
            else:
                timer.gpu_done()
                self.scheduler.advance(sched, step.sample_reqs)
                self._inflight = (sched, step)
        if prev is not None:
            outs += self._land(prev, timer)
        return outs

    def _land(self, inflight: tuple[SchedulerOutput, LaunchedStep],
              timer: StepTimer | None = None) -> list[RequestOutput]:
        """Wait for a launched step and process its results."""
        sched, step = inflight
        try:
            result = self.runner.finish(step)
        except Exception as e:
            return self._fail_step(sched, e)
        if timer is not None:
            timer.executed()
        return self._process(sched, result)

    def _process(self, sched: SchedulerOutput, result: StepResult) -> list[RequestOutput]:
        """A finished step's results: failures, logprobs, tokens, stop checks, outputs."""
        failed = [self._fail(self.scheduler_request(rid, sched), err)
                  for rid, err in result.errors.items()]
        for rid, rows in result.prompt_logprobs.items():
            req = self.scheduler_request(rid, sched)
            self._guarded(req, lambda req=req, rows=rows: self.outputs.add_prompt_logprobs(
                req, rows))
        touched = self.scheduler.resolve(sched, result.sampled)
        for req in touched:
            if req.grammar is not None:
                self._guarded(req, lambda req=req: self._advance_grammar(req))
            if req.detokenizer is None and req.logprobs is None:
                continue  # no text, no logprobs: nothing to process for this token
            stop = self._guarded(req, lambda req=req: self.outputs.process_token(req, result))
            if stop is not None:  # a stop string beats a length finish on the same token
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED, stop)
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
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
        if req.status is not RequestStatus.FINISHED_ABORTED:
            req.error = error
            self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
            req.status = RequestStatus.FINISHED_ERROR
        return req

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """The model step raised: fail its requests, keep serving the rest."""
        logger.exception("model step failed; failing its %d requests", len(sched.scheduled),
                         exc_info=exc)
        error = f"model step failed: {type(exc).__name__}: {exc}"
        reqs = [r for r, _ in sched.scheduled if not r.is_finished]
        for req in reqs:
            self.kv.drop_uncomputed(req)  # the step may have half-written these blocks
        return self._collect([self._fail(r, error) for r in reqs])

    def _advance_grammar(self, req: Request) -> None:
        """Feed req's new token to its matcher; a terminated grammar ends the request."""
        if req.grammar is None:
            return
        if not req.grammar.accept_token(req.output_token_ids[-1]):
            req.error = "structured_outputs: a sampled token was rejected by the grammar"
            self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
        elif req.grammar.is_terminated():
            self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)

    @staticmethod
    def scheduler_request(rid: str, sched) -> Request:
        return next(r for r, _ in sched.scheduled if r.request_id == rid)

    def _collect(self, touched: list[Request]) -> list[RequestOutput]:
        parents = dict.fromkeys(r.parent_id for r in touched)
        outs = []
        for pid in parents:
            if pid not in self.parents:  # aborted meanwhile
                continue
            out = request_output(pid, self.parents[pid])
            if out is None:
                continue
            if out.finished:
                del self.parents[pid]
            outs.append(out)
        return outs

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
        self.grammars = None
        self.runner.shutdown()

    @property
    def is_shut_down(self) -> bool:
        """True once shutdown() ran."""
        return self._shut_down

    def _check_open(self) -> None:
        if self._shut_down:
            raise RuntimeError("engine is shut down: build a new one to generate again")
