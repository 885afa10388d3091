"""The uniprocess executor: the engine's one worker, in the engine's own process. Its methods
are the interface every executor offers the engine: launch a step's forward, then its
sampling, finish it (or run a step to the end), release per-request state, report what the
worker built at start-up, and shut down."""

from __future__ import annotations

from compiled_llm.config import EngineArgs
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.model_runner import LaunchedStep, StepResult
from compiled_llm.worker.spec_runner import build_spec_runner
from compiled_llm.worker.step_timer import StepTimer
from compiled_llm.worker.worker import Worker, WorkerSpec


class UniProcExecutor:
    """Runs the engine's steps on one worker in this process."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, tp: TPGroup | None = None) -> None:
        self.worker = Worker(args, spec, tp)  # tp: this process is rank 0 of a group
        self.num_blocks = self.worker.num_blocks
        self.max_model_len = self.worker.max_model_len  # settled from the KV cache's size
        self.startup_seconds = self.worker.startup_seconds
        self.spec_runner = build_spec_runner(args, self.worker)  # None: no speculative decoding

    @property
    def step_timer(self) -> StepTimer:
        """The worker's per-step host and device timer (the engine brackets each step)."""
        return self.worker.runner.step_timer

    @property
    def model_config(self):
        """The loaded model's config."""
        return self.worker.runner.model.config

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self.model_config.vocab_size

    def launch_forward(self, sched: SchedulerOutput,
                       prev: LaunchedStep | None = None) -> LaunchedStep:
        """Queue one step's forward on the device (see ModelRunner.launch_forward)."""
        return self.worker.runner.launch_forward(sched, prev)

    def launch_sampling(self, step: LaunchedStep) -> LaunchedStep:
        """Queue a launched forward's sampling (see ModelRunner.launch_sampling)."""
        return self.worker.runner.launch_sampling(step)

    def finish(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step and read its results."""
        return self.worker.runner.finish(step)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one step to the end (with speculative decoding when configured)."""
        if self.spec_runner is not None:
            return self.spec_runner.execute(sched)
        return self.worker.runner.execute(sched)

    def release(self, finished: set[str], preempted: set[str] = frozenset()) -> None:
        """Drop the per-request state of finished and preempted requests."""
        self.worker.runner.release(finished, preempted)
        if self.spec_runner is not None:
            self.spec_runner.proposer.release(finished, preempted)

    def cudagraph_batch_sizes(self) -> list[int]:
        """The batch sizes with a captured full (whole-model) graph."""
        return list(self.worker.runner.dispatcher.full_sizes)

    def cudagraph_capture_seconds(self) -> dict[str, float]:
        """Seconds spent capturing, per graph mode."""
        return dict(self.worker.runner.cudagraph_capture_seconds)

    def shutdown(self) -> None:
        """Shut the worker down: its device memory goes back (idempotent)."""
        self.worker.shutdown()
