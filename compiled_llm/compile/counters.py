"""Compilation counters: what the backend captured, split, compiled and reused.

One process-wide instance, read by tests and logs; `reset()` between experiments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class CompileCounters:
    """Process-wide totals since the last reset(); the dicts are keyed by pass and stage."""

    graphs_captured: int = 0  # backend invocations (Dynamo graphs)
    recompiles: int = 0  # captures after the first for the same model
    pieces: int = 0  # pieces between attention ops, over all captures
    unique_pieces: int = 0  # pieces actually compiled or loaded (the rest reuse them)
    inductor_compiles: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_corrupt: int = 0
    snapshot_loads: int = 0  # warm starts that skipped Dynamo
    full_graph_replays: int = 0  # decode steps replayed as one whole-model CUDA graph
    verify_graph_replays: int = 0  # of which speculative verify steps (k + 1 tokens a request)
    piecewise_steps: int = 0  # steps run through piecewise CUDA graphs
    pass_matches: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def graph_breaks(self) -> int:
        """Dynamo's own count (fullgraph=True turns any break into an error)."""
        from compiled_llm.compat import graph_break_count

        return graph_break_count()

    def add_time(self, stage: str, seconds: float) -> None:
        """Add seconds spent in a compile stage."""
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def add_matches(self, name: str, count: int) -> None:
        """Add count rewrites by the pass called name."""
        self.pass_matches[name] = self.pass_matches.get(name, 0) + count

    def reset(self) -> None:
        """Every counter back to its default."""
        for spec in dataclasses.fields(self):
            default = spec.default_factory() if callable(spec.default_factory) else spec.default
            setattr(self, spec.name, default)


counters = CompileCounters()
