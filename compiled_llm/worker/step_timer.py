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
        n, g = max(self.steps, 1), max(self.gpu_steps, 1)
        gpu_ms = 1e3 * self.gpu_s / g
        cpu_ms = 1e3 * self.cpu_s / n
        return {"schedule_ms": 1e3 * self.schedule_s / n, "prepare_ms": 1e3 * self.prepare_s / n,
                "output_ms": 1e3 * self.output_s / n, "cpu_ms": cpu_ms,
                "forward_wall_ms": 1e3 * self.forward_s / n, "gpu_ms": gpu_ms,
                "cpu_pct_of_gpu": 100 * cpu_ms / gpu_ms if gpu_ms else float("nan")}


class StepTimer:
    """Marks, in order, per step: begin, scheduled, forward_start, gpu_done (optional), executed,
    end. Marks outside an open step (warm-up, profiling, capture) are ignored."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stats = StepStats()
        self._open = False
        self._t: dict[str, float] = {}
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._free: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._pair: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def begin(self) -> None:
        self._open, self._t = True, {"begin": time.perf_counter()}

    def scheduled(self) -> None:
        self._t["scheduled"] = time.perf_counter()

    def forward_start(self) -> None:
        """Just before the forward is launched (inputs prepared)."""
        if not self._open:
            return
        self._t["forward"] = time.perf_counter()
        if self.cuda:
            self._pair = self._free.pop() if self._free else (
                torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._pair[0].record()

    def gpu_done(self) -> None:
        """After the last sampling kernel is launched, before its result is read on the host."""
        if not self._open or "forward" not in self._t or "gpu_done" in self._t:
            return
        self._t["gpu_done"] = time.perf_counter()
        if self._pair is not None:
            self._pair[1].record()
            self._pending.append(self._pair)
            self._pair = None

    def executed(self) -> None:
        """The runner returned (sampled tokens are on the host)."""
        self.gpu_done()  # a step that sampled nothing ends its device span here
        self._t["executed"] = time.perf_counter()

    def end(self) -> None:
        t, self._open = self._t, False
        if "forward" not in t:  # nothing ran (empty step) or the step failed before the model
            return
        now, s = time.perf_counter(), self.stats
        s.steps += 1
        s.schedule_s += t.get("scheduled", t["begin"]) - t["begin"]
        s.prepare_s += t["forward"] - t.get("scheduled", t["begin"])
        executed = t.get("executed", now)
        s.forward_s += executed - t["forward"]
        s.output_s += now - executed
        if not self.cuda:
            s.gpu_steps += 1
            s.gpu_s += t.get("gpu_done", executed) - t["forward"]
        self._collect()

    def _collect(self) -> None:
        """Add the device time of every finished event pair; query() never blocks."""
        if self._pair is not None:  # forward started but no gpu_done (failed step)
            self._free.append(self._pair)
            self._pair = None
        while self._pending and self._pending[0][1].query():
            start, stop = pair = self._pending.pop(0)
            self.stats.gpu_steps += 1
            self.stats.gpu_s += start.elapsed_time(stop) / 1e3
            self._free.append(pair)
