"""Prometheus metrics of the server (prometheus-client), in a registry of its own: request
outcomes, token counts and latency histograms from AsyncLLM's per-request hooks; KV-cache usage
and queue sizes from the engine's latest stats snapshot at scrape time. With several API servers
(PROMETHEUS_MULTIPROC_DIR set) a scrape sums the counters and histograms over all of them.
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
from prometheus_client.multiprocess import MultiProcessCollector

from compiled_llm.entrypoints.async_llm import AsyncLLM, RequestObserver

_PREFIX = "compiled_llm:"
OUTCOMES = ("stop", "length", "abort", "error", "rejected")
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


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
        self.ttft = self._histogram("time_to_first_token_seconds", "Time to first token")
        self.itl = self._histogram("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = self._histogram("e2e_request_latency_seconds", "End-to-end request latency")

    def _histogram(self, name: str, doc: str):
        return Histogram(f"{_PREFIX}{name}", doc, ["model_name"], buckets=_LATENCY,
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

    def rejected(self) -> None:
        """Count a request refused at admission."""
        self.requests.labels(outcome="rejected", **self._labels).inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of a /metrics scrape."""
        return generate_latest(self._scraped), CONTENT_TYPE_LATEST


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """What `count` calls of histogram.observe(value) do, with one update of the sum and of
    the bucket (a per-token cost on the streaming path otherwise)."""
    histogram._sum.inc(value * count)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds):
        if value <= bound:
            bucket.inc(count)
            return


class _Totals:
    """A collector: counters and histograms summed over the processes that share
    PROMETHEUS_MULTIPROC_DIR, gauges from `local` (they read the engine core's stats, the same
    in every process: summing them would count the core once per API server)."""

    def __init__(self, local: CollectorRegistry) -> None:
        self.local = local

    def collect(self):
        """The metric families of a scrape."""
        gauges = [family for family in self.local.collect() if family.type == "gauge"]
        names = {family.name for family in gauges}
        yield from (family for family in MultiProcessCollector(None).collect()
                    if family.name not in names)
        yield from gauges
