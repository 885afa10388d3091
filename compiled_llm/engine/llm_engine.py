"""LLMEngine: the front end of one engine. It processes inputs (validate, tokenize, fan n > 1
out into child sequences), hands child requests to the engine core (in this process, or in a
process of its own) and turns the core's outputs into RequestOutputs (text, logprob records,
stop strings). Faults stay contained: an error in one request's processing fails that request
alone, a failed model step fails that step's requests, and the engine goes on serving."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

# At import, not in load_tokenizer: importing transformers leaves frames alive in reference
# cycles, and inside LLMEngine.__init__ they would hold the engine until the garbage collector.
from transformers import AutoTokenizer

from compiled_llm.config import EngineArgs
from compiled_llm.core.gc_heap import install_gc_debug
from compiled_llm.core.kv_cache_manager import PrefixCacheStats
from compiled_llm.engine.core_spec import DEMO_MODEL, core_spec, eos_ids, resolve_device
from compiled_llm.engine.core_types import EngineStats
from compiled_llm.engine.generation_defaults import generation_defaults, max_tokens_cap
from compiled_llm.engine.input_processor import InputProcessor, PromptType
from compiled_llm.engine.inputs import with_text
from compiled_llm.engine.model_config import ModelConfigView
from compiled_llm.engine.startup import StartupClock, format_timeline
from compiled_llm.lora.request import LoRARequest
from compiled_llm.output.output_processor import (
    OutputProcessor,
    child_outputs,
    request_output,
)
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.output.request_state import RequestState
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams
from compiled_llm.worker.spec import WorkerSpec
from compiled_llm.worker.step_timer import StepStats

if TYPE_CHECKING:
    from compiled_llm.engine.core_multi import CoreEndpoint

__all__ = ["LLMEngine", "EngineStats", "resolve_device", "eos_ids", "core_spec",
           "load_tokenizer", "DEMO_MODEL"]

logger = logging.getLogger(__name__)


def load_tokenizer(args: EngineArgs):
    """The tokenizer of args.tokenizer, else of the model."""
    return AutoTokenizer.from_pretrained(args.tokenizer or str(args.model or DEMO_MODEL))


class LLMEngine:
    """The front end over one engine core; `step()` runs (or, with the core in its own
    process, waits for) one step. Invariant: every request the engine accepted finishes (or
    is aborted) with its KV blocks back in the pool. After shutdown() it holds no device
    memory and refuses add_request and step. With the core in this process, step() runs
    the step; under async scheduling (the default) it returns the tokens of the step
    launched before, one step behind, so one more step() than tokens is needed at the end,
    and has_unfinished_requests() stays true until every launched step is read."""

    _shut_down = False

    def __init__(self, args: EngineArgs, core_process: bool = False,
                 core_endpoint: CoreEndpoint | None = None) -> None:
        """core_endpoint: attach to that shared core process (core_process is then implied)
        instead of starting one."""
        self.args = args
        core_process = core_process or core_endpoint is not None
        modules_before = set(sys.modules)
        clock = StartupClock()
        model_dir = str(args.model or DEMO_MODEL)
        torch.manual_seed(args.seed)
        self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(args)
        clock.mark("tokenizer")
        spec, self.eos_token_ids = core_spec(args, self.tokenizer)
        self.device, self.dtype = spec.device, spec.dtype
        # what a request leaves unset: the model's generation config (ValueError before the
        # core is started when it is not usable)
        self.sampling_defaults = generation_defaults(model_dir, args.generation_config,
                                                     args.override_generation_config)
        self.max_tokens_cap = max_tokens_cap(args.generation_config,
                                             args.override_generation_config,
                                             self.sampling_defaults)
        clock.mark("config")  # hf config, EOS ids, generation defaults
        self._core_process = core_process
        self.core = self._make_core(args, spec, core_process, core_endpoint)
        info = self.core.info
        # what building the core took beyond its worker's phases: a core process's start
        clock.add(info.startup_seconds, within="engine_core_other")
        self.startup_seconds = clock.finish()
        self.max_model_len = info.max_model_len
        self._model_config = ModelConfigView(args, info.model_config,
                                             max_model_len=self.max_model_len, dtype=self.dtype,
                                             runner_type="generate",
                                             sampling_defaults=self.sampling_defaults)
        self.inputs = InputProcessor(self.tokenizer, info.vocab_size,
                                     self.eos_token_ids, self.max_model_len, args,
                                     info.model_config)
        self.inputs.attach_matchers = not core_process  # a process core builds its own
        self.inputs.request_id_prefix = getattr(self.core, "request_id_prefix", "")
        if not core_process:  # a bound method of the processor: no cycle through the engine
            self.core.grammars = self.inputs.grammar_manager
        self.outputs = OutputProcessor(self.tokenizer)
        self.parents: dict[str, list[RequestState]] = {}
        # child request id -> prompt tokens served from the prefix cache, as the core reports
        self._num_cached: dict[str, int] = {}
        logger.info("engine ready: %s on %s, %d KV blocks, max_model_len %d; start-up: %s",
                    model_dir, self.device, info.num_blocks, self.max_model_len,
                    format_timeline(self.startup_seconds))
        # Imports done lazily while this engine was built (tokenizer classes, Triton, Inductor)
        # can leave garbage cycles whose frames reach this frame and so the engine: collect
        # them now, so dropping the engine frees it without waiting for the collector. Not in
        # an API server over a shared core (core_endpoint): it keeps its engine for life and
        # freezes its heap next, and the collection took 0.22-0.30 s of every warm start.
        # Nor when this build imported no library (only model files and compiled kernels,
        # which leave no such cycle): a full collection of a large heap costs 0.3-0.4 s.
        if core_endpoint is None and imported_a_library(modules_before):
            gc.collect()
        install_gc_debug()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, usage_context: Any = None,
                         stat_loggers: list | None = None,
                         enable_multiprocessing: bool = False) -> LLMEngine:
        """vLLM's constructor: an engine over engine_args, its core where
        engine_args.engine_core_process puts it, else in a process of its own with
        enable_multiprocessing or on CUDA (as LLM decides); usage_context changes nothing;
        ValueError for stat_loggers (this engine logs no stats)."""
        if stat_loggers:
            raise ValueError("stat_loggers are not supported")
        core_process = engine_args.engine_core_process
        if core_process is None:
            core_process = enable_multiprocessing or \
                resolve_device(engine_args.device).type == "cuda"
        return cls(engine_args, core_process=core_process)

    def _make_core(self, args: EngineArgs, spec: WorkerSpec, core_process: bool,
                   endpoint: CoreEndpoint | None):
        if core_process:
            from compiled_llm.engine.core_client import CoreClient

            return CoreClient(args, spec, self.eos_token_ids, endpoint)
        # imported here: a front end whose core runs in another process never needs the
        # core's stack (the worker, the compiler, Dynamo: 1.7 s of imports on the CPU)
        from compiled_llm.engine.core import InProcCore

        return InProcCore(args, spec)  # its grammars come from the input processor, below

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}."""
        return self.inputs.tokenize(prompt)

    def add_request(self, request_id: str, prompt: PromptType,
                    params: SamplingParams | None = None, arrival_time: float | None = None,
                    lora_request=None, tokenization_kwargs: dict[str, Any] | None = None,
                    trace_headers: Any = None, priority: int = 0,
                    prompt_text: str | None = None) -> None:
        """Validate and queue; raises ValueError (naming the field) without side effects.
        vLLM's arguments: arrival_time (time.time()) starts the request's latency clock;
        lora_request: the LoRARequest the prompt runs with (None: the base model); priority
        needs scheduling_policy="priority"; prompt_text names a token prompt's text;
        tokenization_kwargs and trace_headers are refused (tokenize it: prompt_token_ids)."""
        self._check_open()
        if tokenization_kwargs or trace_headers:
            name = "tokenization_kwargs" if tokenization_kwargs else "trace_headers"
            raise ValueError(f"{name}: not taken by LLMEngine.add_request (AsyncLLM takes "
                             "tokenization_kwargs; a token prompt needs none)")
        if arrival_time is not None and (isinstance(arrival_time, bool)
                                         or not isinstance(arrival_time, int | float)):
            raise ValueError(f"arrival_time must be a number (time.time()), got "
                             f"{arrival_time!r}")
        if request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        children = self.inputs.process(request_id, with_text(prompt, prompt_text),
                                       params or SamplingParams(), priority, lora_request)
        # n > 1 names its sequences "{index}_{request_id}": another request may bear that name
        taken = next((c.request_id for c in children if c.request_id in self.outputs.states),
                     None)
        if taken is not None:
            raise ValueError(f"request_id {request_id!r}: sequence id {taken!r} is already in "
                             "use by a running request")
        self.core.info.check_fits(children)
        self.parents[request_id] = [self.outputs.start(child, arrival_time)
                                    for child in children]
        self.core.add_requests(children)

    def abort_request(self, request_id: str | Iterable[str]) -> RequestOutput | None:
        """Abort a request and its children. Returns its final output, finish_reason "abort"
        on each child still running (what vLLM's AsyncLLM yields last); None, and nothing
        done, for an unknown or finished id. Several ids (vLLM v1's list) return None."""
        if not isinstance(request_id, str):
            for one in list(request_id):
                self.abort_request(one)
            return None
        children = self.parents.pop(request_id, [])
        if not children:
            return None
        for child in children:
            self._num_cached.pop(child.request_id, None)
        self.core.abort_requests([child.request_id for child in children])
        self.outputs.finish_aborted(children)
        return request_output(request_id, children)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is unfinished or a launched step is not yet read."""
        return bool(self.parents) or self.core.has_unfinished()

    def get_num_unfinished_requests(self) -> int:
        """Sequences not finished yet, each of an n > 1 request's counted (as vLLM v1 counts
        its child requests); a launched step not yet read counts none."""
        return sum(state.finish_reason is None
                   for children in self.parents.values() for state in children)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live requests (cached blocks nobody holds are free)."""
        return self.core.num_used_blocks

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative prefix-cache hits and queries, in tokens and in blocks."""
        return self.core.prefix_cache_stats

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (blocks held by requests stay theirs)."""
        self.core.reset_prefix_cache()

    def get_tokenizer(self):
        """The HF tokenizer (vLLM's LLMEngine.get_tokenizer); None with skip_tokenizer_init."""
        return self.tokenizer

    # ------------------------------------------------------------------ LoRA adapters (vLLM's)
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check and add an adapter for later requests (its weights page into a device slot at
        its first step); True, also when it is already added. ValueError naming the field, and
        nothing added, for a bad one: its lora_path missing or damaged, max_lora_rank or
        target_modules not fitting the model, LoRA off, its id naming another adapter."""
        self._check_open()
        return self.inputs.loras.add(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Drop an added adapter (requests running with it finish with it); False if it is not
        added. A request or add_lora naming it again adds it back; its id names no other."""
        return self.inputs.loras.remove(lora_id)

    def list_loras(self) -> set[int]:
        """The ids of the adapters added, or named by a request, and not removed."""
        return set(self.inputs.loras.adapters)

    def pin_lora(self, lora_id: int) -> bool:
        """Refused (NotImplementedError): device slots page least recently used first and
        none can be reserved for one adapter yet."""
        raise NotImplementedError(f"pin_lora({lora_id!r}) is not supported by compiled-llm: "
                                  "adapters page into device slots least recently used first")

    @property
    def model_config(self) -> ModelConfigView:
        """vLLM's ModelConfig names (max_model_len, dtype, hf_config, get_vocab_size() ...)
        over this engine, and the loaded model's DecoderConfig fields (vocab_size ...)."""
        return self._model_config

    def get_model_config(self) -> ModelConfigView:
        """model_config (vLLM's LLMEngine.get_model_config)."""
        return self._model_config

    def get_stats(self) -> EngineStats:
        """The engine's load now: running and waiting requests, blocks, preemptions."""
        return self.core.get_stats()

    def get_metrics(self) -> list:
        """vLLM v1's LLMEngine.get_metrics: what LLM.get_metrics returns."""
        from compiled_llm.engine.metrics import engine_metrics

        return engine_metrics(self.get_stats())

    # the in-process core's parts, for tests and tools that reach inside (AttributeError
    # with the core in its own process)
    @property
    def executor(self):
        """The in-process core's executor."""
        return self.core.executor

    @property
    def scheduler(self):
        """The in-process core's scheduler."""
        return self.core.scheduler

    @property
    def kv(self):
        """The in-process core's KV cache manager."""
        return self.core.kv

    # ------------------------------------------------------------------ step
    @property
    def step_stats(self) -> StepStats:
        """A snapshot of the per-step host and device time totals (subtract two for a window)."""
        return self.core.step_stats

    def step(self, timeout_s: float | None = None) -> list[RequestOutput]:
        """Run one core step and return the outputs of requests that progressed or failed.
        With the core in its own process, wait for its next outputs instead: at most
        timeout_s (None: until some come), and [] at once when nothing is unfinished."""
        self._check_open()
        if self._core_process and not self.has_unfinished_requests():
            return []  # nothing will come (an in-process core's idle step releases state)
        core_outputs = self.core.step(timeout_s)
        cached = self._num_cached
        for core_out in core_outputs:
            if core_out.num_cached_tokens is not None:
                cached[core_out.request_id] = core_out.num_cached_tokens
        touched, finishes = self.outputs.process(core_outputs)
        if finishes:
            self.core.finish_requests(finishes)
        return self._collect(touched)

    def _collect(self, touched: list[RequestState]) -> list[RequestOutput]:
        """The outputs of the user requests among touched that have news: one per request
        (children merged) for n = 1 and FINAL_ONLY, one per child that progressed for a
        streamed n > 1 request (vLLM's shape)."""
        outs: list[RequestOutput] = []
        moved: set[RequestState] | None = None  # built only for a streamed n > 1 request
        # a running FINAL_ONLY child has no output to give, nor has its parent (hot: skipped)
        news = [state.parent_id for state in touched if state.finish_reason is not None
                or state.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY]
        for parent_id in dict.fromkeys(news):
            children = self.parents.get(parent_id)
            if children is None:  # aborted meanwhile
                continue
            if len(children) > 1 and \
                    children[0].sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:
                moved = set(touched) if moved is None else moved
                made = child_outputs(parent_id, children, moved)
            else:  # n = 1, or FINAL_ONLY: one output (if any news) for the whole request
                out = request_output(parent_id, children)
                if out is None:
                    continue
                made = (out,)
            cached = max(self._num_cached.get(children[0].request_id, 0), 0)
            for out in made:
                out.num_cached_tokens = cached
            if made and made[-1].finished:
                self._forget(parent_id, children)
            outs.extend(made)
        return outs

    def _forget(self, parent_id: str, children: list[RequestState]) -> None:
        """Drop a request whose last output is out."""
        del self.parents[parent_id]
        for child in children:
            self.outputs.drop(child.request_id)
            self._num_cached.pop(child.request_id, None)

    # ------------------------------------------------------------------ start-up report
    @property
    def cudagraph_batch_sizes(self) -> list[int]:
        """The batch sizes with a captured whole-model graph ([] without CUDA graphs)."""
        return self.core.info.cudagraph_batch_sizes

    @property
    def cudagraph_capture_seconds(self) -> dict[str, float]:
        """Seconds spent capturing CUDA graphs, per mode (full, piecewise)."""
        return self.core.info.cudagraph_capture_seconds

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Abort every request and release the KV cache, step buffers, CUDA graphs, compiled
        code and weights (idempotent); add_request and step raise RuntimeError after."""
        if self._shut_down:
            return
        self._shut_down = True
        for request_id in list(self.parents):
            self.abort_request(request_id)
        self.inputs.grammars = None
        self.core.shutdown()

    @property
    def is_shut_down(self) -> bool:
        """True once shutdown() ran."""
        return self._shut_down

    def _check_open(self) -> None:
        """RuntimeError once the engine is shut down."""
        if self._shut_down:
            raise RuntimeError("engine is shut down: build a new one to generate again")


def imported_a_library(before: set[str]) -> bool:
    """Whether a module outside compiled_llm (and outside Inductor's compiled kernels, named
    by hash) joined sys.modules since `before`."""
    return any(not name.startswith(("compiled_llm", "torch._inductor.runtime.compile_tasks."))
               and not name.endswith(".kernel") for name in set(sys.modules) - before)
