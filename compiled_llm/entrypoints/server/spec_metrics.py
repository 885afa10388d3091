"""The server's speculative-decoding counters, from the engine's stats snapshot at scrape time:
drafts, draft tokens, accepted tokens and accepted tokens per draft position (label
`position`), exported as compiled_llm:spec_decode_* and under vLLM's vllm:spec_decode_*."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_PREFIX = "compiled_llm:"
COUNTERS = (("num_drafts", "Verify steps of requests with draft tokens", "spec_num_drafts"),
            ("num_draft_tokens", "Draft tokens proposed", "spec_num_draft_tokens"),
            ("num_accepted_tokens", "Draft tokens accepted", "spec_num_accepted_tokens"))


class SpecDecodeCounters(Collector):
    """Nothing until the engine has verified a draft (speculative decoding off: no family)."""

    def __init__(self, engine, labels: dict[str, str]) -> None:
        self.engine, self.labels = engine, labels

    def collect(self):
        """The counters, read from one snapshot."""
        stats = self.engine.stats
        if not stats.spec_accepted_per_pos:
            return
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, attr in COUNTERS:
            family = CounterMetricFamily(f"{_PREFIX}spec_decode_{name}", doc, labels=names)
            family.add_metric(values, getattr(stats, attr))
            yield family
        family = CounterMetricFamily(f"{_PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft",
                                     labels=[*names, "position"])
        for pos, count in enumerate(stats.spec_accepted_per_pos):
            family.add_metric([*values, str(pos)], count)
        yield family
