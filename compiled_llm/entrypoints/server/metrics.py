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
from compiled_llm.entrypoints.request_stream import RequestSummary
from compiled_llm.entrypoints.server.spec_metrics import SpecDecodeCounters
from compiled_llm.entrypoints.server.vllm_metrics import vllm_families

_PREFIX = "compiled_llm:"
OUTCOMES = ("stop", "length", "abort", "error", "rejected")
# vLLM v1's buckets (vllm/v1/metrics/loggers.py), so that dashboards' `le` values exist here
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_N = (1, 2, 5, 10, 20)
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
        self.ttft = self._histogram("time_to_first_token_seconds", "Time to first token", _TTFT)
        self.itl = self._histogram("inter_token_latency_seconds",
                                   "Time between a request's outputs (one per step)", _ITL)
        self.e2e = self._histogram("e2e_request_latency_seconds", "End-to-end request latency",
                                   _REQUEST)
        self._request_histograms()
        self.prompt_lengths = self._histogram("request_prompt_tokens",
                                              "Prompt tokens per finished request", _LENGTHS)
        self.gen_lengths = self._histogram("request_generation_tokens",
                                           "Generated tokens per finished request", _LENGTHS)

    def _request_histograms(self) -> None:
        """vLLM's per-request histograms of parameters and decode timing."""
        self.params_n = self._histogram("request_params_n", "n of each request", _N)
        self.params_max_tokens = self._histogram("request_params_max_tokens",
                                                 "max_tokens of each request", _LENGTHS)
        self.max_gen_tokens = self._histogram("request_max_num_generation_tokens",
                                              "Tokens of each request's longest sequence",
                                              _LENGTHS)
        self.decode_time = self._histogram("request_decode_time_seconds",
                                           "Seconds from a request's first token to its last",
                                           _REQUEST)
        self.tpot = self._histogram("request_time_per_output_token_seconds",
                                    "A request's decode time per token after its first", _ITL)
        self.phases = {phase: self._histogram(f"request_{phase}_time_seconds", doc, _REQUEST)
                       for phase, doc in (
                           ("queue", "Seconds a request waited to be admitted"),
                           ("prefill", "Seconds from a request's admission to its first token"),
                           ("inference", "Seconds from a request's admission to its last token"))}

    def _histogram(self, name: str, doc: str, buckets: tuple):
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
    def on_output(self, rid: str, new_tokens: int, first: bool, gap_s: float,
                  prompt_tokens: int = 0) -> None:
        """Count the tokens as they come (vLLM counts each step's), and observe the time to
        first token, or the gap since the previous output (one per step, as vLLM)."""
        self.gen_tokens.inc(new_tokens)
        if first:
            self.prompt_tokens.inc(prompt_tokens)
            self.ttft.observe(gap_s)
        else:
            self.itl.observe(gap_s)

    def on_finish(self, outcome: str, prompt_tokens: int, gen_tokens: int,
                  e2e_s: float) -> None:
        """Count a finished sequence by outcome, with its lengths and end-to-end latency."""
        self.requests.labels(outcome=outcome, **self._labels).inc()
        self.e2e.observe(e2e_s)
        self.prompt_lengths.observe(prompt_tokens)
        self.gen_lengths.observe(gen_tokens)

    def on_request_end(self, summary: RequestSummary) -> None:
        """Observe a finished request's parameters, longest sequence and decode timing."""
        self.params_n.observe(summary.n)
        if summary.max_tokens is not None:
            self.params_max_tokens.observe(summary.max_tokens)
        self.max_gen_tokens.observe(summary.max_gen_tokens)
        for phase, histogram in self.phases.items():
            seconds = getattr(summary, f"{phase}_s")
            if seconds is not None:
                histogram.observe(seconds)
        if summary.decode_s is None:
            return
        self.decode_time.observe(summary.decode_s)
        per_sequence = summary.max_gen_tokens
        if per_sequence > 1:
            self.tpot.observe(summary.decode_s / (per_sequence - 1))

    def pooled(self, prompt_tokens: int, seconds: float) -> None:
        """Count a pooling request (its prompt is all its work) as a finished one."""
        self.prompt_tokens.inc(prompt_tokens)
        self.on_finish("stop", prompt_tokens, 0, seconds)

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
