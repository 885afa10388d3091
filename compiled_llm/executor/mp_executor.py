"""The multiprocess executor: tensor or pipeline parallelism, a process and device per rank.
Rank 0 is the driver, in the engine's process (it runs the scheduler's steps and samples; it
holds the last pipeline stage); ranks 1..N-1 are worker processes started here, following the
driver's broadcast steps (worker/tp_follower.py). A worker that dies fails the engine's steps
with an error naming it, not a hang; shutdown stops the workers and leaves the group."""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch

from compiled_llm.config import EngineArgs
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.distributed.parallel_state import destroy_tp_group, init_tp_group
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.distributed.quant_shards import check_quantized_tp
from compiled_llm.distributed.tensor_parallel import check_shardable
from compiled_llm.executor.mp_worker import rank_spec, run_worker
from compiled_llm.executor.uniproc_executor import UniProcExecutor
from compiled_llm.worker.loader import build_model_config, checkpoint_files, load_hf_config
from compiled_llm.worker.model_runner import LaunchedStep, StepResult
from compiled_llm.worker.worker import WorkerSpec

logger = logging.getLogger(__name__)
_JOIN_S = 10.0  # how long a stopping worker gets before it is killed
_EXIT_GRACE_S = 2.0  # how long a failed collective waits to see which worker died


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Rank:
    """One follower's process and the read end of its status pipe. On CPU it is forked (no
    second interpreter start); on CUDA, where a fork cannot inherit the device, it is a new
    interpreter taking its arguments pickled on stdin. A fork must not inherit garbage: a
    dropped engine's gloo process group, collected in the child, joins threads that exist only
    in the parent and hangs the rank, so the executor collects before it forks."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, rank: int, init_method: str) -> None:
        read_fd, write_fd = os.pipe()
        self.name, self.kind = f"rank {rank}", _kind(args)
        worker_args = (args, spec, rank, init_method, write_fd)
        if spec.device.type == "cpu":
            self.process = multiprocessing.get_context("fork").Process(
                target=run_worker, args=worker_args, name=f"tp-{self.name}", daemon=True)
            self.process.start()
        else:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "compiled_llm.executor.mp_worker"],
                stdin=subprocess.PIPE, pass_fds=(write_fd,))
            self.process.stdin.write(pickle.dumps((*worker_args, sys.path)))
            self.process.stdin.close()
        os.close(write_fd)
        self.status = os.fdopen(read_fd, "rb")

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        """The process's exit status, None while it runs."""
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll()
        return self.process.exitcode

    def wait_ready(self) -> None:
        """Block until the rank has loaded; RuntimeError with its error if it failed."""
        reply = self.status.read()  # the worker closes the pipe once it has reported
        self.status.close()
        status, detail = pickle.loads(reply) if reply else ("error", "it exited")
        if status != "ready":
            raise RuntimeError(f"{self.kind} worker {self.name} failed to start: {detail}")

    def stop(self, seconds: float) -> None:
        """Wait for the process to exit, killing it after `seconds`."""
        if isinstance(self.process, subprocess.Popen):
            try:
                self.process.wait(seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            return
        self.process.join(seconds)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()


def _kind(args: EngineArgs) -> str:
    """How errors name a worker: tensor-parallel or pipeline-parallel."""
    return args.parallel_field.split("_")[0] + "-parallel"


def _check_model(args: EngineArgs, model_dir: str) -> None:
    """ValueError naming the field when the model cannot be split over the ranks."""
    hf_config = load_hf_config(model_dir)
    if args.pipeline_parallel_size > 1 and hf_config.get("quantization_config") is not None:
        raise ValueError(f"pipeline_parallel_size {args.pipeline_parallel_size} with a "
                         "quantized checkpoint is not supported yet")
    model_cls, config = build_model_config(hf_config)
    if args.pipeline_parallel_size > 1:
        check_pipeline(model_cls, config, args.pipeline_parallel_size)
    if args.tensor_parallel_size > 1:
        if not getattr(model_cls, "supports_tensor_parallel", True):
            raise ValueError(f"tensor_parallel_size {args.tensor_parallel_size}: "
                             f"{config.architecture} is not sharded yet (run it with 1)")
        # a model sharded under some of its options only (StableLM: not its per-head q/k norms)
        getattr(model_cls, "check_tensor_parallel", lambda *args: None)(
            config, args.tensor_parallel_size)
        check_shardable(config, args.tensor_parallel_size, args.enable_expert_parallel)
        # a quantized checkpoint's packing, groups and blocks (distributed/quant_shards.py)
        check_quantized_tp(model_cls, config, hf_config,
                           lambda: checkpoint_files(Path(model_dir), args.load_format),
                           args.tensor_parallel_size, args.quantization,
                           args.enable_expert_parallel)


def _shutdown_at_exit(executor: MultiprocExecutor):
    """Register the executor's shutdown to run at interpreter exit, while the modules it needs
    are whole (a script that ends with its engine alive); a weak reference, so a dropped
    engine is still collected. Returns the hook shutdown() unregisters."""
    ref = weakref.ref(executor)

    def at_exit() -> None:
        alive = ref()
        if alive is not None:
            alive.shutdown()

    atexit.register(at_exit)
    return at_exit


class MultiprocExecutor(UniProcExecutor):
    """The UniProcExecutor interface over a group of ranks; this process is rank 0."""

    rank_cls = _Rank  # how a follower rank is started (Ray actors: ray_executor.py)

    def __init__(self, args: EngineArgs, spec: WorkerSpec) -> None:
        world = args.world_size
        self.procs, self.tp, self.dead, self.kind = [], None, None, _kind(args)
        if world == 1:  # rank 0 is this process: nothing to start, no group to join
            super().__init__(args, spec)
            return
        if spec.device.type == "cuda" and torch.cuda.device_count() < world:
            raise ValueError(f"{args.parallel_field} {world} needs {world} GPUs; "
                             f"{torch.cuda.device_count()} are visible")
        self.worker = None
        _check_model(args, spec.model_dir)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        if spec.device.type == "cpu":  # the ranks are forked: see _Rank
            gc.collect()
        self.procs = [self.rank_cls(args, spec, rank, init_method) for rank in range(1, world)]
        self._at_exit = _shutdown_at_exit(self)
        try:
            spec = rank_spec(spec, 0)
            self.tp = init_tp_group(0, world, init_method, spec.device,
                                    pipeline_size=args.pipeline_parallel_size)
            for proc in self.procs:
                proc.wait_ready()
            super().__init__(args, spec, self.tp)
        except BaseException:
            self.shutdown()
            raise

    def check_workers(self) -> None:
        """RuntimeError naming the first worker that has died (and from then on, always)."""
        if self.dead is None:
            gone = next((p for p in self.procs if p.exitcode is not None), None)
            if gone is not None:
                self.dead = (f"{self.kind} worker {gone.name} (pid {gone.pid}) "
                             f"died with exit code {gone.exitcode}; the engine cannot run steps")
                logger.error(self.dead)
        if self.dead is not None:
            raise RuntimeError(self.dead)

    def _checked(self, call, *call_args):
        self.check_workers()
        try:
            return call(*call_args)
        except Exception:
            # a collective failed, most likely because a worker died: name it if so (its
            # exit may reach us a moment after its sockets closed)
            deadline = time.monotonic() + _EXIT_GRACE_S
            while time.monotonic() < deadline and all(p.exitcode is None for p in self.procs):
                time.sleep(0.05)
            self.check_workers()
            raise

    def launch_forward(self, sched: SchedulerOutput,
                       prev: LaunchedStep | None = None) -> LaunchedStep:
        """Queue one step's forward on every rank (the driver's runner broadcasts it)."""
        return self._checked(super().launch_forward, sched, prev)

    def launch_sampling(self, step: LaunchedStep) -> LaunchedStep:
        """Queue the step's sampling (its LM-head gather runs on every rank)."""
        return self._checked(super().launch_sampling, step)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one step to the end on every rank."""
        return self._checked(super().execute, sched)

    def __del__(self, suppress=contextlib.suppress) -> None:
        # a dropped engine (no shutdown call) must not leave its workers waiting on a step and
        # this process in their group: a later multi-rank engine here could not join one
        # (suppress bound now: at interpreter exit this module's names may be gone)
        with suppress(Exception):
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the workers (killed if they do not stop), free rank 0's device memory and
        leave the process group (idempotent)."""
        worker, self.worker = self.worker, None
        at_exit = getattr(self, "_at_exit", None)
        if at_exit is not None:
            atexit.unregister(at_exit)
        if worker is not None:
            # one rank (mp at size 1): no followers, no stop message
            if self.procs and self.dead is None and all(p.exitcode is None for p in self.procs):
                try:
                    worker.runner.step_hook.stop()
                except Exception:  # a worker went away while stopping: it is killed below
                    logger.warning("%s workers did not take the stop message", self.kind)
            worker.shutdown()
        for proc in self.procs:
            proc.stop(_JOIN_S)
        self.procs = []
        tp, self.tp = self.tp, None
        if tp is not None:  # only its own group: a newer engine's may be the process's now
            destroy_tp_group(tp)
