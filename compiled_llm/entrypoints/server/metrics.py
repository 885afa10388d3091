"""Prometheus metrics of the server (prometheus-client), in a registry of its own: request
outcomes, token counts and latency histograms from AsyncLLM's per-request hooks; KV-cache usage,
queue sizes and prefix-cache counts from the engine's latest stats snapshot at scrape time; each
under vLLM's name too (vllm_metrics.py). With several API servers (PROMETHEUS_MULTIPROC_DIR set)
a scrape sums the counters and histograms over all of them.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from compiled_llm.entrypoints.async_llm import AsyncLLM, RequestObserver
from compiled_llm.entrypoints.server.spec_metrics import SpecDecodeCounters
from compiled_llm.entrypoints.server.vllm_metrics import vllm_families

_PREFIX = "compiled_llm:"
OUTCOMES = ("stop", "length", "abort", "error", "rejected")
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LENGTHS = tuple(step * 10**power for power in range(7) for step in (1, 2, 5))  # tokens


class ServerMetrics(RequestObserver):
    """Implements AsyncLLM's RequestObserver; `bind(engine)` adds the engine gauges."""

    def __init__(self, model_name: str, multiprocess: bool = False) -> None:
        """multiprocess: scrapes report the totals of every API-server process."""
        self.registry = registry = CollectorRegistry()
        self._scraped = registry
        if multiprocess:
            self._scraped = CollectorRegistry()
            self._scraped.register(_Totals(registry))
        labels = {"model_name": model_name}
        self._labels = labels
        self.requests = Counter(f"{_PREFIX}request_success", "Finished requests by outcome "
                                "(stop, length, abort, error, rejected)",
                                ["model_name", "outcome"], registry=registry)
        for outcome in OUTCOMES:  # exported at 0 from the start
            self.requests.labels(outcome=outcome, **labels)
        self.prompt_tokens = Counter(f"{_PREFIX}prompt_tokens", "Prefill tokens processed",
                                     ["model_name"], registry=registry).labels(**labels)
        self.gen_tokens = Counter(f"{_PREFIX}generation_tokens", "Tokens generated",
                                  ["model_name"], registry=registry).labels(**labels)
        self._aliases = CollectorRegistry()
        self._aliases.register(_Families(self._scraped, vllm_families))
        self.ttft = self._histogram("time_to_first_token_seconds", "Time to first token")
        self.itl = self._histogram("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = self._histogram("e2e_request_latency_seconds", "End-to-end request latency")
        self.prompt_lengths = self._histogram("request_prompt_tokens",
                                              "Prompt tokens per finished request", _LENGTHS)
        self.gen_lengths = self._histogram("request_generation_tokens",
                                           "Generated tokens per finished request", _LENGTHS)

    def _histogram(self, name: str, doc: str, buckets: tuple = _LATENCY):
        return Histogram(f"{_PREFIX}{name}", doc, ["model_name"], buckets=buckets,
                         registry=self.registry).labels(**self._labels)

    def bind(self, engine: AsyncLLM) -> None:
        """Gauges that read the engine's stats snapshot when scraped."""
        gauges = {
            "num_requests_running": ("Requests in the running batch", "num_running"),
            "num_requests_waiting": ("Requests waiting to be scheduled", "num_waiting"),
            "kv_cache_usage_perc": ("Fraction of KV-cache blocks in use (0..1)", "kv_usage"),
            "kv_cache_used_blocks": ("KV-cache blocks in use", "num_used_blocks"),
            "num_preemptions": ("Preemptions so far", "num_preemptions"),
        }
        for name, (doc, attr) in gauges.items():
            gauge = Gauge(f"{_PREFIX}{name}", doc, ["model_name"], registry=self.registry)
            gauge.labels(**self._labels).set_function(
                lambda attr=attr: getattr(engine.stats, attr))
        self.registry.register(_PrefixCacheCounters(engine, self._labels))
        self.registry.register(SpecDecodeCounters(engine, self._labels))

    # RequestObserver hooks (called on the event loop)
    def on_output(self, rid: str, new_tokens: int, first: bool, gap_s: float) -> None:
        """Observe time to first token, or the gap per token since the previous output."""
        if first:
            self.ttft.observe(gap_s)
            return
        # tokens that arrived together (merged deltas, n > 1) share the gap evenly
        observe_many(self.itl, gap_s / new_tokens, new_tokens)

    def on_finish(self, outcome: str, prompt_tokens: int, gen_tokens: int,
                  e2e_s: float) -> None:
        """Count a finished request by outcome, its tokens, and its end-to-end latency."""
        self.requests.labels(outcome=outcome, **self._labels).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.gen_tokens.inc(gen_tokens)
        self.e2e.observe(e2e_s)
        self.prompt_lengths.observe(prompt_tokens)
        self.gen_lengths.observe(gen_tokens)

    def rejected(self) -> None:
        """Count a request refused at admission."""
        self.requests.labels(outcome="rejected", **self._labels).inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of a /metrics scrape: every metric, then its vLLM aliases."""
        return generate_latest(self._scraped) + generate_latest(self._aliases), \
            CONTENT_TYPE_LATEST


class _Families(Collector):
    """A collector that yields what a function of the source registry's families gives."""

    def __init__(self, source: CollectorRegistry, derive) -> None:
        self.source, self.derive = source, derive

    def collect(self):
        """The derived families, from one collection of the source."""
        return self.derive(list(self.source.collect()))


class _PrefixCacheCounters(Collector):
    """Prefix-cache lookups and hits, in prompt tokens, from the engine's stats snapshot."""

    def __init__(self, engine: AsyncLLM, labels: dict[str, str]) -> None:
        self.engine, self.labels = engine, labels

    def collect(self):
        """Both counters, read from the snapshot once."""
        stats = self.engine.stats
        for name, doc, value in (
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                 stats.prefix_cache_queries),
                ("prefix_cache_hits", "Prompt tokens served from the prefix cache",
                 stats.prefix_cache_hits)):
            family = CounterMetricFamily(f"{_PREFIX}{name}", doc, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), value)
            yield family


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """What `count` calls of histogram.observe(value) do, with one update of the sum and of
    the bucket (a per-token cost on the streaming path otherwise)."""
    histogram._sum.inc(value * count)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds):
        if value <= bound:
            bucket.inc(count)
            return


class _Totals(Collector):
    """A collector: this process's families, each one of the request hooks (counters and
    histograms) replaced by its sum over the processes that share PROMETHEUS_MULTIPROC_DIR;
    the engine's (read from its stats snapshot, the same in every API server) as they are."""

    def __init__(self, local: CollectorRegistry) -> None:
        self.local = local

    def collect(self):
        """The metric families of a scrape."""
        totals = {family.name: family for family in MultiProcessCollector(None).collect()}
        for family in self.local.collect():
            total = totals.get(family.name)
            yield family if total is None or family.type == "gauge" else total
