"""Always-on timing of engine steps: host time (schedule, input prep, output processing) beside
device time (model forward + sampling). GPU spans use CUDA events read only once complete, so
timing adds no device sync; on CPU every span is perf_counter."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch


@dataclass
class StepStats:
    """Totals over the engine steps that ran the model (seconds); subtract two snapshots to get
    a window. `gpu_s` covers `gpu_steps` steps (events not yet complete are counted later)."""

    steps: int = 0
    schedule_s: float = 0.0  # scheduler.schedule
    prepare_s: float = 0.0  # release + step inputs built on the host
    forward_s: float = 0.0  # host wall from forward launch to sampled tokens on the host
    output_s: float = 0.0  # scheduler update, output processing, request outputs
    gpu_steps: int = 0
    gpu_s: float = 0.0  # device time of forward + sampling

    @property
    def cpu_s(self) -> float:
        """Host time outside the model: the time the device waits on the host each step."""
        return self.schedule_s + self.prepare_s + self.output_s

    def __sub__(self, other: StepStats) -> StepStats:
        return StepStats(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                            for f in dataclasses.fields(self)})

    def per_step_ms(self) -> dict[str, float]:
        """Mean milliseconds per step of each part; cpu_pct_of_gpu = host overhead / GPU time."""
        steps, gpu_steps = max(self.steps, 1), max(self.gpu_steps, 1)
        gpu_ms = 1e3 * self.gpu_s / gpu_steps
        cpu_ms = 1e3 * self.cpu_s / steps
        return {"schedule_ms": 1e3 * self.schedule_s / steps,
                "prepare_ms": 1e3 * self.prepare_s / steps,
                "output_ms": 1e3 * self.output_s / steps, "cpu_ms": cpu_ms,
                "forward_wall_ms": 1e3 * self.forward_s / steps, "gpu_ms": gpu_ms,
                "cpu_pct_of_gpu": 100 * cpu_ms / gpu_ms if gpu_ms else float("nan")}


class StepTimer:
    """Marks, in order, per step: begin, scheduled, forward_start, gpu_done (optional), executed,
    end. Marks outside an open step (warm-up, profiling, capture) are ignored."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stats = StepStats()
        self._open = False
        self._marks: dict[str, float] = {}
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._free: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._pair: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        # device ms of the spans the last end() read: on CUDA, steps landed (oldest first);
        # on the CPU, the step just run (its forward is synchronous)
        self.collected_ms: list[float] = []

    def begin(self) -> None:
        """A step starts (before scheduling)."""
        self._open, self._marks = True, {"begin": time.perf_counter()}
        self.collected_ms.clear()

    def scheduled(self) -> None:
        """The scheduler has decided the step."""
        self._marks["scheduled"] = time.perf_counter()

    def forward_start(self) -> None:
        """Just before the forward is launched (inputs prepared)."""
        if not self._open:
            return
        self._marks["forward"] = time.perf_counter()
        if self.cuda:
            self._pair = self._free.pop() if self._free else (
                torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._pair[0].record()

    def gpu_done(self) -> None:
        """After the last sampling kernel is launched, before its result is read on the host."""
        if not self._open or "forward" not in self._marks or "gpu_done" in self._marks:
            return
        self._marks["gpu_done"] = time.perf_counter()
        if self._pair is not None:
            self._pair[1].record()
            self._pending.append(self._pair)
            self._pair = None

    def executed(self) -> None:
        """The runner returned (sampled tokens are on the host)."""
        self.gpu_done()  # a step that sampled nothing ends its device span here
        self._marks["executed"] = time.perf_counter()

    def end(self) -> None:
        """The step's outputs are made: add its spans to the stats (device time once ready)."""
        marks, self._open = self._marks, False
        if "forward" not in marks:  # nothing ran (empty step) or the step failed before the model
            return
        now, stats = time.perf_counter(), self.stats
        begin, scheduled = marks["begin"], marks.get("scheduled", marks["begin"])
        stats.steps += 1
        stats.schedule_s += scheduled - begin
        stats.prepare_s += marks["forward"] - scheduled
        executed = marks.get("executed", now)
        stats.forward_s += executed - marks["forward"]
        stats.output_s += now - executed
        if not self.cuda:
            span = marks.get("gpu_done", executed) - marks["forward"]
            stats.gpu_steps += 1
            stats.gpu_s += span
            self.collected_ms.append(1e3 * span)
        self._collect()

    def _collect(self) -> None:
        """Add the device time of every finished event pair; query() never blocks."""
        if self._pair is not None:  # forward started but no gpu_done (failed step)
            self._free.append(self._pair)
            self._pair = None
        while self._pending and self._pending[0][1].query():
            start, stop = pair = self._pending.pop(0)
            millis = start.elapsed_time(stop)
            self.collected_ms.append(millis)
            self.stats.gpu_steps += 1
            self.stats.gpu_s += millis / 1e3
            self._free.append(pair)
