"""The start-up timeline of an engine's process: time before the engine (interpreter start,
imports, argument parsing), the engine's own phases, and the total from process start to
ready; read by `compiled-llm compile`, the server's log and benchmarks/startup.py."""

from __future__ import annotations

import os
import time


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), or None where that is not known."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
    except OSError:
        return None
    # field 22 of stat (20th after the command name): start time in clock ticks since boot
    return now - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def format_age(age: float | None) -> str:
    """A process age for a log line: seconds to 2 places, "?" where it is not known."""
    return "?" if age is None else f"{age:.2f}"


class StartupClock:
    """Phases of one engine's start-up in order: `before_engine` (from process start), each
    mark()ed phase, and `total` (process start to ready) once finish() is called."""

    def __init__(self) -> None:
        age = process_age_s()
        self.phases: dict[str, float] = {} if age is None else {"before_engine": age}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Close `phase` at now (it began where the previous one ended)."""
        now = time.perf_counter()
        self.phases[phase] = now - self._last
        self._last = now

    def add(self, phases: dict[str, float], within: str) -> None:
        """Record sub-phases timed elsewhere (the worker's) and close `within` at now, as
        what of it they do not cover (the core's process start and imports, say)."""
        now = time.perf_counter()
        covered = sum(phases.values())
        self.phases.update(phases)
        self.phases[within] = max(0.0, now - self._last - covered)
        self._last = now

    def finish(self) -> dict[str, float]:
        """The phases, plus `total` from process start to now where the start is known."""
        age = process_age_s()
        if age is not None:
            self.phases["total"] = age
        return dict(self.phases)


def format_timeline(phases: dict[str, float]) -> str:
    """One log line: "before_engine 3.1 s, config 0.2 s, ... total 9.8 s"."""
    return ", ".join(f"{name} {secs:.2f} s" for name, secs in phases.items())
