"""The engine's metrics as vLLM v1's `LLM.get_metrics()` gives them: Counter, Gauge and Vector
objects with `.name` (vLLM's Prometheus name), `.labels` and `.value` (`.values` for a
vector), read from one EngineStats snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field

from compiled_llm.engine.core_types import EngineStats


@dataclass
class Metric:
    """One metric: its vLLM name and labels."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Counter(Metric):
    """A cumulative count."""

    value: int = 0


@dataclass
class Gauge(Metric):
    """A value now."""

    value: float = 0.0


@dataclass
class Vector(Metric):
    """A list of counts (vLLM: per-position counters), `values[i]` for position i."""

    values: list[int] = field(default_factory=list)

    @property
    def value(self) -> list[int]:
        """The counts (vLLM's Vector has `.values`; `.value` reads the same)."""
        return self.values


def engine_metrics(stats: EngineStats, labels: dict[str, str] | None = None) -> list[Metric]:
    """The metrics of a stats snapshot, spec_decode ones only when speculative decoding ran."""
    tags = dict(labels or {})
    out: list[Metric] = [
        Gauge("vllm:num_requests_running", tags, stats.num_running),
        Gauge("vllm:num_requests_waiting", tags, stats.num_waiting),
        Gauge("vllm:kv_cache_usage_perc", tags, stats.kv_usage),
        Counter("vllm:num_preemptions", tags, stats.num_preemptions),
        Counter("vllm:prefix_cache_queries", tags, stats.prefix_cache_queries),
        Counter("vllm:prefix_cache_hits", tags, stats.prefix_cache_hits),
    ]
    if stats.spec_accepted_per_pos:
        out += [Counter("vllm:spec_decode_num_drafts", tags, stats.spec_num_drafts),
                Counter("vllm:spec_decode_num_draft_tokens", tags, stats.spec_num_draft_tokens),
                Counter("vllm:spec_decode_num_accepted_tokens", tags,
                        stats.spec_num_accepted_tokens),
                Vector("vllm:spec_decode_num_accepted_tokens_per_pos", tags,
                       list(stats.spec_accepted_per_pos))]
    return out
