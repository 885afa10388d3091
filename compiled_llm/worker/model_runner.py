"""ModelRunner: owns every device tensor (weights, KV cache, step inputs, CUDA graphs and their
memory pool) and runs one step: the input batch fills flat inputs padded to the graph the
dispatcher picks -> forward under the forward context (full graph, piecewise or plain) -> logits
for the rows that need them -> Sampler -> plain Python results for the scheduler.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.attention.kv_quant import cache_dtype, is_fp8
from compiled_llm.compile.counters import counters
from compiled_llm.config import CacheConfig, CompileConfig
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.sampler import Sampler, compute_prompt_logprobs
from compiled_llm.sample.uploads import upload
from compiled_llm.worker.cudagraph import (
    FULL,
    PIECEWISE,
    CUDAGraphDispatcher,
    CUDAGraphWrapper,
    full_graph_sizes,
    piecewise_graph_sizes,
)
from compiled_llm.worker.graph_capture import (
    capture_full,
    capture_piecewise,
    dummy_schedule,
    verify_sizes,
)
from compiled_llm.worker.input_batch import InputBatch, StepInputs
from compiled_llm.worker.kv_cache import allocate_caches, initial_scales, layer_kv_shapes
from compiled_llm.worker.step_timer import StepTimer

logger = logging.getLogger(__name__)
LogprobRow = tuple[list[int], list[float], int]  # (ids, logprobs, rank of ids[0])


@dataclass
class StepResult:
    """A finished step's results on the host, by request id."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, LogprobRow] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[LogprobRow]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # request id -> why it failed
    # request id -> why it was left out of the step before the forward (its KV is unwritten)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class LaunchedStep:
    """A step queued on the device: first its forward (`launch_forward`: `hidden` and
    `inputs` kept for the sampling), then its sampling (`launch_sampling`), with the results
    copied back without blocking. `finish` reads them; the next step may read `sampled` on
    the device."""

    result: StepResult  # errors, known at launch
    sample_reqs: list[Request] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # [T, hidden] until the sampling is launched
    inputs: StepInputs | None = None
    sampled: torch.Tensor | None = None  # [S] device int64
    host: list[torch.Tensor] = field(default_factory=list)  # host copies: tokens, logprobs
    # request id -> host copies of its prompt logprobs (ids, logprobs, ranks)
    prompt_host: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    event: torch.cuda.Event | None = None  # recorded after the copies


class ModelRunner:
    """Runs steps of one model on one device. Invariant: the input batch's buffers, the KV
    cache and every captured graph keep their addresses for the runner's life."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype,
                 cache_cfg: CacheConfig, compile_cfg: CompileConfig, max_model_len: int,
                 attn_backend: str = "torch", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, lora=None) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.lora = lora  # the LoRA slot pool (lora/manager.py) when enable_lora
        self.cache_cfg, self.compile_cfg = cache_cfg, compile_cfg
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.max_blocks_per_seq = -(-max_model_len // cache_cfg.block_size)
        self.attn_backend = attn_backend
        self.cudagraph_capture_seconds: dict[str, float] = {}  # seconds per graph mode
        self.sampler = Sampler(device, model.config.vocab_size)
        self.kv_caches: list[torch.Tensor] = []
        self.kv_dtype = cache_dtype(cache_cfg.cache_dtype, dtype)
        # FP8 caches: [L, 2, Hkv] scales, and whether the next real step calibrates them
        self.kv_scales, self.calibrate_kv = None, False
        self.step_timer = StepTimer(device)  # the engine brackets each step
        self.dispatcher = CUDAGraphDispatcher()
        # this runner's own graph memory pool: engines in one process never share one
        uses_graphs = device.type == "cuda" and compile_cfg.cudagraph_mode != "none"
        self.graph_pool = torch.cuda.graph_pool_handle() if uses_graphs else None
        self.capture_stream = torch.cuda.Stream(device) if uses_graphs else None
        self.forward_fn = self._build_forward(model, compile_cfg)
        self.full_graph = (CUDAGraphWrapper(self.forward_fn, FULL, self.graph_pool,
                                            self.capture_stream)
                           if self._wants(FULL) else None)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.input_batch = self._make_input_batch(max_num_seqs, max_num_batched_tokens)
        self.step_hook = None  # called with each step's inputs (tensor parallel: broadcast)
        self.verify_query_len = 0  # k + 1 under speculative decoding: full verify graphs

    def set_max_model_len(self, max_model_len: int) -> None:
        """Settle the longest sequence once the KV cache is sized (the profiling run used an
        upper bound): the step buffers are remade at its block-table width. Only before any
        graph is captured, since graphs read the buffers' addresses."""
        if max_model_len == self.max_model_len:
            return
        if self.dispatcher.full_sizes or self.dispatcher.piecewise_sizes:
            raise RuntimeError("max_model_len cannot change once CUDA graphs are captured")
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // self.cache_cfg.block_size)
        self.input_batch = self._make_input_batch(self.max_num_seqs, self.max_num_batched_tokens)

    def _wants(self, mode: str) -> bool:
        """Whether cudagraph_mode asks for graphs of this mode (and the device has them). No
        full graphs over the torch attention backend: its decode sizes its key gather on the
        host, so a graph would gather max_model_len keys for every sequence each replay."""
        cfg = self.compile_cfg
        if self.graph_pool is None or mode not in cfg.cudagraph_mode.split("_and_"):
            return False
        if mode == FULL:
            return self.attn_backend != "torch"
        return cfg.mode == "backend"  # pieces exist only under our backend

    def _build_forward(self, model: nn.Module, cfg: CompileConfig):
        if cfg.mode == "none":
            return model
        from compiled_llm.compile import compile_model

        # a partial, not a method: the compiled pieces must not hold the runner (no cycle)
        wrap = (partial(CUDAGraphWrapper, mode=PIECEWISE, pool=self.graph_pool,
                        stream=self.capture_stream)
                if self._wants(PIECEWISE) else None)
        return compile_model(model, cfg, self.dtype, wrap)

    def _make_input_batch(self, max_num_seqs: int, max_num_batched_tokens: int) -> InputBatch:
        """Sized for the largest step: the token budget (or a padded graph), the sequence cap,
        and the profiling run's requests of max_model_len tokens each."""
        graphs = max(self.compile_cfg.cudagraph_batch_sizes or [0])
        seqs = max(max_num_seqs, graphs, -(-max_num_batched_tokens // self.max_model_len))
        tokens = step_tokens(self.compile_cfg, max_num_seqs, max_num_batched_tokens)
        batch = InputBatch(tokens, seqs, self.max_blocks_per_seq, self.cache_cfg.block_size,
                           self.device, self.dispatcher, self.model.config.vocab_size)
        batch.long_rows_start = max((getattr(module, "long_rows_start", 0)
                                     for module in self.model.modules()), default=0)
        return batch

    # ------------------------------------------------------------------ KV cache
    def kv_bytes_per_block(self) -> int:
        """Bytes one KV block takes over all layers (K and V)."""
        elems = sum(heads * dim for heads, dim in layer_kv_shapes(self.model.config))
        return 2 * self.cache_cfg.block_size * elems * self.kv_dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """One [2, blocks, block_size, KV heads, head dim] tensor per layer, zeroed (FP8:
        with the checkpoint's scales, else ones that the first real step calibrates)."""
        config = self.model.config
        self.kv_caches = allocate_caches(config, num_blocks, self.cache_cfg.block_size,
                                         self.kv_dtype, self.device)
        if is_fp8(self.kv_dtype):
            self.kv_scales, self.calibrate_kv = initial_scales(
                config, getattr(self.model, "checkpoint_kv_scales", None), self.device)

    # ------------------------------------------------------------------ step
    def run_forward(self, inputs: StepInputs, capturing: bool = False,
                    calibrate: bool = False) -> torch.Tensor:
        """hidden [T, hidden] under the step's graph key: a full graph, piecewise, or plain
        (always plain when it calibrates FP8 KV scales: the op must run)."""
        key = None if calibrate else inputs.cudagraph_key
        ctx = ForwardContext(inputs.attn, self.kv_caches, self.attn_backend,
                             cudagraph_key=key, capturing=capturing, kv_scales=self.kv_scales,
                             calibrate_kv_scales=calibrate)
        full = key is not None and key.mode == FULL
        counters.piecewise_steps += int(key is not None and not full and not capturing)
        forward = self.full_graph if full else self.forward_fn
        with set_forward_context(ctx):  # padded rows write the null block only
            return forward(inputs.input_ids, inputs.positions)[:inputs.num_tokens]

    def release(self, finished: set[str], preempted: set[str] = frozenset()) -> None:
        """Drop per-request state: finished requests lose their block-table rows and sampler
        state; preempted ones only their rows (they resume with a new block list)."""
        self.sampler.release(finished)
        self.input_batch.release(finished, preempted)
        if self.lora is not None:
            self.lora.release(finished | preempted)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one step to the end: sampled tokens on the host."""
        return self.finish(self.launch_sampling(self.launch_forward(sched)))

    @torch.inference_mode()
    def launch_forward(self, sched: SchedulerOutput, prev: LaunchedStep | None = None,
                       dummy: bool = False) -> LaunchedStep:
        """Queue one step's forward (and its prompt logprobs) without waiting for it; its
        sampling is launched by `launch_sampling`. Input ids still pending on the host are
        taken from prev's sampled tokens on the device (async scheduling). The first real
        (not dummy) step calibrates FP8 KV scales that the checkpoint lacked."""
        self.release(sched.finished_req_ids, sched.preempted_req_ids)
        sched, lora_errors = (sched, {}) if self.lora is None else self.lora.page_in(sched)
        inputs = self.input_batch.prepare(sched)
        if self.lora is not None:  # each token's adapter slot
            inputs.skipped.update(lora_errors)
            self.lora.prepare_step([item for item in sched.scheduled
                                    if item[0].request_id not in inputs.skipped],
                                   len(inputs.input_ids))
        if inputs.has_pending:
            fill_pending(inputs.input_ids, prev)
        inputs.calibrate_kv = self.calibrate_kv and not dummy
        if inputs.calibrate_kv:
            self.calibrate_kv = False  # once: the scales stay fixed from here on
        if self.step_hook is not None:  # (tensor parallel: followers calibrate on this step too)
            self.step_hook(inputs)
        self.step_timer.forward_start()
        hidden = self.run_forward(inputs, calibrate=inputs.calibrate_kv)
        step = LaunchedStep(StepResult(skipped=inputs.skipped), inputs.sample_reqs, hidden,
                            inputs)
        if inputs.prompt_rows:
            self._prompt_logprobs(hidden, inputs, step)
        return step

    @torch.inference_mode()
    def launch_sampling(self, step: LaunchedStep) -> LaunchedStep:
        """Queue a launched forward's sampling, its metadata built from the requests as they
        are now (async scheduling: after the previous step landed, when a row needs it), and
        the copies of the results to the host."""
        hidden, inputs, step.hidden, step.inputs = step.hidden, step.inputs, None, None
        if inputs is not None and inputs.sample_reqs:
            self._sample(hidden, inputs, step)
        self.step_timer.gpu_done()
        if self.device.type == "cuda" and (step.host or step.prompt_host):
            step.event = torch.cuda.Event()
            step.event.record()
        return step

    def finish(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step's copies and turn them into Python results (the one read
        of device results in a step)."""
        if step.event is not None:
            step.event.synchronize()
        result, reqs = step.result, step.sample_reqs
        for rid, host in step.prompt_host.items():
            ids, logprobs, ranks = (t.tolist() for t in host)
            result.prompt_logprobs[rid] = list(zip(ids, logprobs, ranks))
        step.prompt_host = {}
        if not step.host:
            return result
        result.sampled.update(zip([req.request_id for req in reqs], step.host[0].tolist()))
        if len(step.host) > 1:
            ids, logprobs, ranks = (t.tolist() for t in step.host[1:])
            for i, req in enumerate(reqs):
                if req.sampling_params.logprobs is not None:
                    k = req.sampling_params.logprobs + 1
                    result.logprobs[req.request_id] = (ids[i][:k], logprobs[i][:k], ranks[i])
        step.host = []
        return result

    def execute_dummy(self, num_tokens: int, max_len: int) -> None:
        """One step of dummy requests (warm-up, profiling); their table rows go back after."""
        sched = dummy_schedule(num_tokens, self.cache_cfg.block_size, max_len)
        try:
            self.finish(self.launch_sampling(self.launch_forward(sched, dummy=True)))
        finally:
            self.release({r.request_id for r, _ in sched.scheduled})

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, step: LaunchedStep) -> None:
        if not inputs.all_rows_sample:
            hidden = hidden.index_select(0, inputs.sample_rows)
        logits = self.model.compute_logits(hidden)
        meta = self.sampler.prepare(inputs.sample_reqs)
        out = self.sampler(logits, meta)
        for row, err in meta.row_errors.items():
            step.result.errors[inputs.sample_reqs[row].request_id] = err
        step.sampled = out.sampled_token_ids
        lp = out.logprobs
        dev = [step.sampled] + ([] if lp is None else [lp.token_ids, lp.logprobs, lp.ranks])
        step.host = [to_host(t) for t in dev]

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: StepInputs,
                         step: LaunchedStep) -> None:
        """Score the step's prompt tokens on the device; `finish` reads the host copies."""
        for prompt_rows in inputs.prompt_rows:
            k = prompt_rows.req.sampling_params.prompt_logprobs
            index = upload(np.stack([prompt_rows.rows, prompt_rows.targets]), torch.int64,
                           self.device)
            logits = self.model.compute_logits(hidden[index[0]]).float()
            lp = compute_prompt_logprobs(logits, index[1], k)
            step.prompt_host[prompt_rows.req.request_id] = tuple(
                to_host(t) for t in (lp.token_ids, lp.logprobs, lp.ranks))

    # ------------------------------------------------------------------ CUDA graphs
    def cudagraph_plan(self) -> tuple[list[int], list[int]]:
        """The (piecewise, full) sizes that cudagraph_mode asks for (none on CPU); the driver
        of several ranks sends them to the followers, which capture the same."""
        piecewise = piecewise_graph_sizes(min(self.compile_cfg.piecewise_max_tokens,
                                              self.max_model_len - 1))
        full = sorted(set(self.compile_cfg.cudagraph_batch_sizes
                          or full_graph_sizes(self.max_num_seqs)))
        return (piecewise if self._wants(PIECEWISE) else [], full if self._wants(FULL) else [])

    @torch.inference_mode()  # captures made as inference tensors, as steps run
    def capture_cudagraphs(self, plan: tuple[list[int], list[int]] | None = None) -> None:
        """Capture the plan's graphs (default: cudagraph_plan()), before serving (nothing on
        CPU); the dispatcher hands the sizes out from then on."""
        piecewise, full = self.cudagraph_plan() if plan is None else plan
        if piecewise or full:  # once: the captures themselves keep the warm-ups' blocks
            torch.cuda.empty_cache()
        if piecewise:
            self.cudagraph_capture_seconds[PIECEWISE] = capture_piecewise(self, piecewise)
        if full:
            self.cudagraph_capture_seconds[FULL] = capture_full(self, full)
        verify = verify_sizes(full, self.verify_query_len, self.input_batch.max_tokens)
        if self.verify_query_len > 1 and verify:
            self.cudagraph_capture_seconds["verify"] = capture_full(self, verify,
                                                                   self.verify_query_len)
        if self.cudagraph_capture_seconds:
            logger.info("CUDA graph capture: %s", self.cudagraph_capture_seconds)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Release the KV cache, step buffers, CUDA graphs, the compiled forward and the
        weights, and give the freed memory back to the device (idempotent). No step can run
        after; the engine refuses them first."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a launched step may still read what goes
        release = getattr(self.forward_fn, "release", None)
        if self.full_graph is not None:
            self.full_graph.release()
        self.dispatcher = CUDAGraphDispatcher()  # no graph is handed out any more
        self.kv_caches, self.input_batch, self.full_graph = [], None, None
        self.forward_fn = self.model = self.graph_pool = self.capture_stream = None
        self.sampler.generators.clear()
        if release is not None:  # Dynamo keeps the compiled graphs (and their piece graphs)
            release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def step_tokens(cfg: CompileConfig, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """The most tokens one forward runs (the step buffers' rows): the token budget, the
    sequence cap, the largest full graph or the largest piecewise graph."""
    graphs = max(cfg.cudagraph_batch_sizes or [0])
    return max(max_num_batched_tokens, max_num_seqs, graphs, cfg.piecewise_max_tokens)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of t on the host that does not block: pinned memory on CUDA (read it only after
    the step's event)."""
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def fill_pending(ids: torch.Tensor, prev: LaunchedStep | None) -> None:
    """Replace each id ~i (negative) by row i of prev's sampled tokens, on the device."""
    if prev is None or prev.sampled is None:
        raise RuntimeError("a step has pending input tokens but no launched step samples them")
    src = prev.sampled.index_select(0, (~ids).clamp_(0, len(prev.sampled) - 1))
    ids.copy_(torch.where(ids < 0, src, ids))
