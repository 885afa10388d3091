"""Worker: one rank's model on one device. It loads the weights, builds the model runner, sizes
the KV cache from a profiling step (the first compiled call) at max_model_len's upper bound,
settles max_model_len from the blocks that fit, allocates the cache, warms up and captures CUDA
graphs; afterwards it runs the engine's steps through the runner.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from compiled_llm.compat import pin_triton_cache_dir
from compiled_llm.compile.counters import counters
from compiled_llm.compile.isa_probe import start_cpu_isa_probe
from compiled_llm.config import EngineArgs
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.lora.manager import attach_lora
from compiled_llm.speculative import speculative_config_of
from compiled_llm.worker import early_load, precompile, warm_hint
from compiled_llm.worker.compile_children import early_children, stop_early
from compiled_llm.worker.kernel_cache_log import KernelCacheLog
from compiled_llm.worker.kv_budget import budget_blocks
from compiled_llm.worker.loader import load_model
from compiled_llm.worker.model_runner import ModelRunner
from compiled_llm.worker.pipeline_step import wrap_stage_forward
from compiled_llm.worker.spec import WorkerSpec
from compiled_llm.worker.tp_follower import StepBroadcaster

logger = logging.getLogger(__name__)


class Worker:
    """Loads and prepares one model; `runner` runs its steps. startup_seconds times each
    stage: load (weights), compile_and_profile, kv_cache (allocation), warmup, cudagraphs."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, tp: TPGroup | None = None) -> None:
        self.device = spec.device
        sched = spec.scheduler
        start = time.perf_counter()
        if self.device.type == "cuda":  # the context, timed apart from the weights
            pin_triton_cache_dir(self.device.index or 0)
            torch.cuda.synchronize(self.device)
            logger.info("device context: %.2f s", time.perf_counter() - start)
        kernels = KernelCacheLog(self.device.type == "cuda")
        pieces = early_children(self.device, args, tp)  # their imports beside the weights
        try:
            early = early_load.take(args, spec) if tp is None else None
            baseline = torch.cuda.memory_allocated() if self.device.type == "cuda" else 0
            if self.device.type == "cpu" and args.compile_config().mode != "none":
                start_cpu_isa_probe()  # ~1.5 s of Inductor's, now beside the weights' load
            if early is not None:  # loaded by the core process beside its imports
                baseline = early.baseline
                logger.info("weights loaded early: %.2f s, beside the compiler's imports",
                            early.seconds)
            self.runner = build_runner(args, spec, tp, None if early is None else early.model)
            loaded = time.perf_counter()
            kernels.mark("load")
            if tp is not None:  # the driver of a tensor-parallel group: followers mirror its steps
                self.runner.step_hook = StepBroadcaster(tp, self.runner)
            # a cold start: the first call (Dynamo, passes, Inductor) runs in its dry pass
            if precompile.precompile_if_cold(self.runner, args.world_size,
                                             sched.max_num_batched_tokens, sched.max_model_len,
                                             pieces):
                kernels.mark("precompile")
            # the profiling forward is also the first call: Dynamo, passes and Inductor run here
            with precompile.side_pieces(self.runner, args.world_size, pieces):
                self.num_blocks = num_kv_blocks(self.runner, sched.max_num_batched_tokens,
                                                sched.max_model_len, baseline)
        except BaseException:  # else the warm compile children would wait for their go
            stop_early(pieces)
            raise
        if tp is not None:  # the pool is the same on every rank: the fewest blocks any holds
            self.num_blocks = self.runner.step_hook.agree_blocks(self.num_blocks)
        profiled = time.perf_counter()
        kernels.mark("profile")
        warm_hint.record(args, self.runner)  # the next such start skips the children ahead
        self._settle_max_model_len(args, sched.max_model_len)
        self.runner.allocate_kv_cache(self.num_blocks)
        allocated = time.perf_counter()
        self.runner.execute_dummy(1, 1)  # the decode shape
        warm = time.perf_counter()
        kernels.mark("warmup")
        if tp is not None:  # the followers capture the same graphs with it, in lockstep
            self.runner.step_hook.capture(self.runner.cudagraph_plan())
        else:
            self.runner.capture_cudagraphs()
        kernels.mark("capture")
        kernels.log()
        torch.manual_seed(args.seed)  # sampling's draws repeat however the start went
        self.startup_seconds = {"load": loaded - start, "compile_and_profile": profiled - loaded,
                                "kv_cache": allocated - profiled, "warmup": warm - allocated,
                                "cudagraphs": time.perf_counter() - warm}
        if early is not None:
            self.startup_seconds["weights_early"] = early.seconds

    def _settle_max_model_len(self, args: EngineArgs, wanted_len: int) -> None:
        """The KV cache's size is known only now: settle max_model_len before the buffers of
        its width (block tables) are made for good and before any graph reads them."""
        try:
            self.max_model_len = settle_max_model_len(
                wanted_len, args.max_model_len is not None, self.num_blocks, args.block_size)
        except ValueError:
            self.runner.shutdown()
            raise
        self.runner.set_max_model_len(self.max_model_len)

    def shutdown(self) -> None:
        """Free everything the worker holds on its device (idempotent)."""
        self.runner.shutdown()


def build_runner(args: EngineArgs, spec: WorkerSpec, tp: TPGroup | None = None,
                 model: torch.nn.Module | None = None) -> ModelRunner:
    """Load the model (this rank's shard or pipeline stage under `tp`; none when `model`,
    loaded early for these settings, is given) and build its runner."""
    sched, stages = spec.scheduler, args.pipeline_parallel_size
    if model is None:
        model = load_model(spec.model_dir, spec.dtype, spec.device, sched.max_model_len,
                           args.load_format, args.quantization, tp, stages,
                           args.enable_expert_parallel)
    loaded = time.perf_counter()
    before = dict(counters.stage_seconds)  # process-wide: this build's share is the increase
    lora = attach_lora(model, args, sched) if args.enable_lora else None
    if args.speculative_config is not None:  # EAGLE-3 taps the target before it compiles
        from compiled_llm.worker.eagle3 import tap_target

        tap_target(args, model, sched, spec.dtype, spec.device)
    runner = ModelRunner(model, spec.device, spec.dtype, args.cache_config(),
                         args.compile_config(), sched.max_model_len,
                         args.attention_backend_for(spec.device.type, model.config.head_dim),
                         sched.max_num_seqs,
                         sched.max_num_batched_tokens, lora)
    wrap_stage_forward(runner)  # a pipeline stage receives its input and sends its output
    spec_cfg = speculative_config_of(args.speculative_config)
    # verify steps of k drafts + 1 token per request get full graphs too (=0: piecewise only)
    if spec_cfg is not None and os.environ.get("COMPILED_LLM_VERIFY_GRAPHS", "1") != "0":
        runner.verify_query_len = spec_cfg.num_speculative_tokens + 1
    phases = {**model.load_seconds, "runner": time.perf_counter() - loaded}
    # of which the warm start's compiled pieces (snapshot, cache loads), where they ran
    phases.update({f"runner: {stage}": counters.stage_seconds[stage] - before.get(stage, 0.0)
                   for stage in ("snapshot_load", "cache_load") if stage in counters.stage_seconds})
    logger.info("weights phase: %s", ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
    return runner


def num_kv_blocks(runner: ModelRunner, max_tokens: int, max_len: int, baseline: int = 0) -> int:
    """Blocks that fit the budget: a byte budget on CPU, gpu_memory_utilization on GPU after a
    profiling forward of max_tokens tokens (which also warms up compilation). `baseline` is
    the memory allocated before this engine loaded its weights."""
    if runner.cache_cfg.num_gpu_blocks_override:
        return runner.cache_cfg.num_gpu_blocks_override
    runner.allocate_kv_cache(1)
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # on CPU the pass only warms up compilation: a small batch will do
    tokens = max_tokens if runner.device.type == "cuda" else min(max_tokens, 64)
    runner.execute_dummy(tokens, max_len)
    blocks = budget_blocks(runner, baseline)
    runner.kv_caches = []
    return blocks


def settle_max_model_len(max_len: int, explicit: bool, num_blocks: int, block_size: int) -> int:
    """max_model_len once the KV cache's size is known: max_len (the model's, or the one given)
    if one sequence that long fits the usable blocks (all but the null block), else, when
    none was given, the tokens they hold; a given value they cannot hold is a ValueError."""
    kv_tokens = (num_blocks - 1) * block_size
    if max_len <= kv_tokens:
        return max_len
    if explicit:
        raise ValueError(
            f"max_model_len {max_len} does not fit the KV cache, which holds {kv_tokens} tokens "
            f"({num_blocks - 1} blocks of {block_size}): lower max_model_len to at most "
            f"{kv_tokens}, or raise kv_cache_memory_bytes, gpu_memory_utilization or "
            "num_gpu_blocks_override")
    logger.warning("max_model_len %d: the KV cache holds %d tokens, fewer than the model's %d",
                   kv_tokens, kv_tokens, max_len)
    return kv_tokens
