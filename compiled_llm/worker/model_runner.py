"""ModelRunner: owns every device tensor (weights, KV cache, step inputs) and runs one step.

Step: flat inputs -> forward under the forward context -> logits for the rows that need them
-> Sampler. Returns plain Python results for the scheduler and output processing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.compile.counters import counters
from compiled_llm.config import CacheConfig, CompileConfig
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.sampler import (
    Sampler,
    SamplingMetadata,
    compute_prompt_logprobs,
    make_generator,
)
from compiled_llm.sample.structured_outputs import fill_bitmask
from compiled_llm.worker.input_batch import StepInputs, build_step_inputs
from compiled_llm.worker.step_buffers import StepBuffers
from compiled_llm.worker.step_timer import StepTimer

LogprobRow = tuple[list[int], list[float], int]  # (ids, logprobs, rank of ids[0])


@dataclass
class StepResult:
    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, LogprobRow] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[LogprobRow]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # request id -> why it failed


@dataclass
class LaunchedStep:
    """A step queued on the device: forward and sampling launched, results copied back
    without blocking. `finish` reads them; the next step may read `sampled` on the device."""

    result: StepResult  # errors and prompt logprobs, known at launch
    sample_reqs: list[Request] = field(default_factory=list)
    sampled: torch.Tensor | None = None  # [S] device int64
    host: list[torch.Tensor] = field(default_factory=list)  # host copies: tokens, logprobs
    event: torch.cuda.Event | None = None  # recorded after the copies


class ModelRunner:
    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype,
                 cache_cfg: CacheConfig, compile_cfg: CompileConfig, max_model_len: int,
                 attn_backend: str = "torch", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.cache_cfg, self.compile_cfg = cache_cfg, compile_cfg
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // cache_cfg.block_size)
        self.attn_backend = attn_backend
        self.decode_graphs = None
        self.piecewise_sizes: list[int] = []  # set once piecewise graphs are captured
        self.cudagraph_capture_seconds = 0.0
        self.cudagraph_capture_split: dict[str, float] = {}  # seconds per graph kind
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.step_timer = StepTimer(device)  # the engine brackets each step
        self.forward_fn = self._build_forward(model, compile_cfg)
        self.buffers = self._make_buffers(max_num_seqs, max_num_batched_tokens)

    def _build_forward(self, model: nn.Module, cfg: CompileConfig):
        if cfg.mode == "none":
            return model
        from compiled_llm.compile import compile_model

        return compile_model(model, cfg, self.dtype)

    def _make_buffers(self, max_num_seqs: int, max_num_batched_tokens: int) -> StepBuffers:
        """Sized for the largest step: the token budget (or a padded graph), the sequence cap,
        and the profiling run's requests of max_model_len tokens each."""
        cfg = self.compile_cfg
        graphs = max(cfg.cudagraph_batch_sizes or [0])
        seqs = max(max_num_seqs, graphs, -(-max_num_batched_tokens // self.max_model_len))
        tokens = max(max_num_batched_tokens, seqs, cfg.piecewise_max_tokens)
        return StepBuffers(tokens, seqs, self.max_blocks_per_seq, self.device)

    # ------------------------------------------------------------------ KV cache
    def kv_bytes_per_block(self) -> int:
        c = self.model.config
        elems = 2 * self.cache_cfg.block_size * c.num_key_value_heads * c.head_dim
        return elems * c.num_hidden_layers * torch.tensor([], dtype=self.dtype).element_size()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        c = self.model.config
        shape = (2, num_blocks, self.cache_cfg.block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(c.num_hidden_layers)]

    # ------------------------------------------------------------------ step
    def _padding(self, num_seqs: int, num_tokens: int, max_query_len: int):
        """(decode graph size, piecewise padded tokens) for a step; at most one is set."""
        if self.decode_graphs is not None:
            size = self.decode_graphs.size_for(num_seqs, max_query_len)
            if size is not None:
                return size, None
        return None, next((s for s in self.piecewise_sizes if s >= num_tokens), None)

    def prepare(self, sched: SchedulerOutput) -> StepInputs:
        """The step's inputs in the persistent buffers, padded for the graph that will run."""
        return build_step_inputs(sched, self.buffers, self.cache_cfg.block_size, self._padding)

    def run_forward(self, inputs: StepInputs, capturing: bool = False) -> torch.Tensor:
        """hidden [T, hidden]: a full decode graph, piecewise graphs (padded), or plain."""
        if inputs.graph_size is not None:
            return self.decode_graphs.run(inputs.attn.num_seqs, inputs.graph_size)
        tokens = inputs.cudagraph_tokens
        ctx = ForwardContext(inputs.attn, self.kv_caches, self.attn_backend,
                             cudagraph_tokens=tokens, capturing=capturing)
        counters.piecewise_steps += int(tokens is not None and not capturing)
        with set_forward_context(ctx):  # padded rows write the null block only
            return self.forward_fn(inputs.input_ids, inputs.positions)[:inputs.num_tokens]

    def capture_cudagraphs(self, max_num_seqs: int) -> None:
        """Capture CUDA graphs per padded batch size before serving (no-op on CPU)."""
        if self.device.type != "cuda" or self.compile_cfg.cudagraph_mode == "none":
            return
        from compiled_llm.worker.cudagraph import capture_all

        self.cudagraph_capture_split = capture_all(self, max_num_seqs)

    def release(self, finished: set[str], preempted: set[str] = frozenset()) -> None:
        """Drop per-request state: finished requests lose their block-table rows and seeded
        generators; preempted ones only their rows (they resume with a new block list)."""
        for rid in finished:
            self.generators.pop(rid, None)
        self.buffers.table.release(finished)
        self.buffers.table.release(preempted)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one step to the end: sampled tokens on the host."""
        return self.finish(self.launch(sched))

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput, prev: LaunchedStep | None = None) -> LaunchedStep:
        """Queue one step without waiting for it. Input ids still pending on the host are
        taken from prev's sampled tokens on the device (async scheduling)."""
        self.release(sched.finished_req_ids, sched.preempted_req_ids)
        inputs = self.prepare(sched)
        if inputs.has_pending:
            fill_pending(inputs.input_ids, prev)
        self.step_timer.forward_start()
        hidden = self.run_forward(inputs)
        step = LaunchedStep(StepResult(), inputs.sample_reqs)
        if inputs.sample_reqs:
            self._sample(hidden, inputs, step)
        if inputs.prompt_rows:
            self._prompt_logprobs(hidden, inputs, step.result)
        return step

    def finish(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step's copies and turn them into Python results."""
        if not step.host:
            return step.result
        if step.event is not None:
            step.event.synchronize()
        result, reqs = step.result, step.sample_reqs
        tokens = step.host[0].tolist()
        for req, tok in zip(reqs, tokens):
            result.sampled[req.request_id] = tok
        if len(step.host) > 1:
            ids, lps, ranks = (t.tolist() for t in step.host[1:])
            for i, req in enumerate(reqs):
                if req.sampling_params.logprobs is not None:
                    k = req.sampling_params.logprobs + 1
                    result.logprobs[req.request_id] = (ids[i][:k], lps[i][:k], ranks[i])
        return result

    def execute_dummy(self, num_tokens: int, max_len: int) -> None:
        """One step of dummy requests (warm-up, profiling); their table rows go back after."""
        sched = dummy_schedule(num_tokens, self.cache_cfg.block_size, max_len)
        try:
            self.execute(sched)
        finally:
            self.release({r.request_id for r, _ in sched.scheduled})

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, step: LaunchedStep) -> None:
        if not inputs.all_rows_sample:
            hidden = hidden.index_select(0, inputs.sample_rows)
        logits = self.model.compute_logits(hidden)
        meta = self._sampling_metadata(inputs.sample_reqs)
        out = self.sampler(logits, meta)
        for row, err in meta.row_errors.items():
            step.result.errors[inputs.sample_reqs[row].request_id] = err
        self.step_timer.gpu_done()
        step.sampled = out.sampled_token_ids
        lp = out.logprobs
        dev = [step.sampled] + ([] if lp is None else [lp.token_ids, lp.logprobs, lp.ranks])
        step.host = [to_host(t) for t in dev]
        if self.device.type == "cuda":
            step.event = torch.cuda.Event()
            step.event.record()

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: StepInputs, r: StepResult) -> None:
        for pr in inputs.prompt_rows:
            k = pr.req.sampling_params.prompt_logprobs
            rows = torch.from_numpy(pr.rows).to(self.device)
            logits = self.model.compute_logits(hidden[rows]).float()
            targets = torch.from_numpy(pr.targets).to(self.device)
            ids, lps, ranks = compute_prompt_logprobs(logits, targets, k).tolists()
            r.prompt_logprobs[pr.req.request_id] = list(zip(ids, lps, ranks))

    def _generator(self, req: Request) -> torch.Generator | None:
        seed = req.sampling_params.seed
        if seed is None:
            return None
        gen = self.generators.get(req.request_id)
        if gen is None:
            gen = self.generators[req.request_id] = make_generator(seed, self.device)
        return gen

    def _sampling_metadata(self, reqs: list[Request]) -> SamplingMetadata:
        meta = build_sampling_metadata(reqs, self.device, self._generator)
        bitmask, rows = fill_bitmask(reqs, self.model.config.vocab_size)
        if bitmask is not None:
            meta.grammar_bitmask = bitmask.to(self.device, non_blocking=True)
            meta.grammar_rows = rows
        return meta

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Release the KV cache, step buffers, CUDA graphs, the compiled forward and the
        weights, and give the freed memory back to the device (idempotent). No step can run
        after; the engine refuses them first."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a launched step may still read what goes
        release = getattr(self.forward_fn, "release", None)
        self.kv_caches, self.buffers, self.decode_graphs = [], None, None
        self.forward_fn = self.model = None
        self.piecewise_sizes = []
        self.generators.clear()
        if release is not None:  # Dynamo keeps the compiled graphs: empty them
            release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


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


def build_sampling_metadata(reqs: list[Request], device: torch.device, gen_for) -> SamplingMetadata:
    """The batch view of the requests' SamplingParams; optional tensors only when used (an
    all-greedy batch builds none for temperature, top-k/p, min-p or generators)."""
    ps = [r.sampling_params for r in reqs]
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device)  # noqa: E731
    all_greedy = all(p.is_greedy for p in ps)
    rep = any(p.repetition_penalty != 1.0 for p in ps)
    use_pen = rep or any(p.presence_penalty or p.frequency_penalty for p in ps)
    banned = {i: [*(() if r.sampling_params.ignore_eos else r.eos_token_ids),
                  *r.sampling_params.stop_token_ids]
              for i, r in enumerate(reqs) if r.num_output_tokens < r.sampling_params.min_tokens}
    procs = {i: p.logits_processors for i, p in enumerate(ps) if p.logits_processors}
    k = [p.logprobs for p in ps if p.logprobs is not None]
    meta = SamplingMetadata(
        temperature=None, all_greedy=all_greedy, top_k=None, top_p=None, min_p=None,
        generators={},
        presence_penalty=f32([p.presence_penalty for p in ps]) if use_pen else None,
        frequency_penalty=f32([p.frequency_penalty for p in ps]) if use_pen else None,
        repetition_penalty=f32([p.repetition_penalty for p in ps]) if use_pen else None,
        prompt_token_ids=[r.prompt_token_ids for r in reqs] if rep else [],
        output_token_ids=[r.output_token_ids for r in reqs],
        banned_token_ids=banned,
        logits_processors=procs,
        max_num_logprobs=max(k) if k else None,
        any_repetition_penalty=rep,
    )
    if not all_greedy:
        _random_sampling_fields(meta, reqs, ps, f32, gen_for)
    return meta


def _random_sampling_fields(meta: SamplingMetadata, reqs: list[Request], ps, f32, gen_for):
    meta.temperature = f32([0.0 if p.is_greedy else p.temperature for p in ps])
    top_k = [p.top_k for p in ps]
    if any(top_k):
        meta.top_k = torch.tensor(top_k, device=meta.temperature.device)
        meta.max_top_k = max(top_k)
    meta.top_p = f32([p.top_p for p in ps]) if any(p.top_p < 1.0 for p in ps) else None
    meta.min_p = f32([p.min_p for p in ps]) if any(p.min_p > 0.0 for p in ps) else None
    meta.generators = {i: g for i, r in enumerate(reqs) if (g := gen_for(r)) is not None}


def dummy_schedule(num_tokens: int, block_size: int, max_len: int) -> SchedulerOutput:
    """Requests of at most max_len tokens, num_tokens in all, whose K/V land in the null block
    (warm-up and profiling)."""
    from compiled_llm.sampling_params import SamplingParams

    out = SchedulerOutput()
    for i, start in enumerate(range(0, num_tokens, max_len)):
        n = min(max_len, num_tokens - start)
        req = Request(f"__warmup{i}__", [0] * n, SamplingParams(temperature=0.0, max_tokens=1))
        req.block_ids = [0] * -(-n // block_size)
        out.scheduled.append((req, n))
    return out


def num_kv_blocks(runner: ModelRunner, max_tokens: int, max_len: int, baseline: int = 0) -> int:
    """Blocks that fit the budget: a byte budget on CPU, gpu_memory_utilization on GPU after a
    profiling forward of max_tokens tokens (which also warms up compilation). `baseline` is
    the memory allocated before this engine loaded its weights."""
    cfg = runner.cache_cfg
    if cfg.num_gpu_blocks_override:
        return cfg.num_gpu_blocks_override
    per_block = runner.kv_bytes_per_block()
    runner.allocate_kv_cache(1)
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # on CPU the pass only warms up compilation: a small batch will do
    tokens = max_tokens if runner.device.type == "cuda" else min(max_tokens, 64)
    runner.execute_dummy(tokens, max_len)
    if cfg.kv_cache_memory_bytes is not None:
        budget = cfg.kv_cache_memory_bytes
    elif runner.device.type == "cuda":
        budget = _gpu_budget(cfg.gpu_memory_utilization, baseline)
    else:
        budget = 1 << 30
    runner.kv_caches = []
    blocks = budget // per_block
    if blocks < 2:
        raise ValueError(f"KV cache budget of {budget} bytes holds fewer than 2 blocks")
    return int(blocks)


def _gpu_budget(utilization: float, baseline: int) -> int:
    """This engine's share of the device less its own weights and peak activations, and never
    more than is free now (another engine or process may hold the rest)."""
    free, total = torch.cuda.mem_get_info()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    own = torch.cuda.max_memory_allocated() - baseline
    # keep the same headroom as `utilization` implies (CUDA graphs, sampler, other processes)
    return min(int(total * utilization) - own, free + cached - int(total * (1 - utilization)))
