"""/metrics carries the speculative-decoding counters (ours and vLLM's names, per-position
acceptance by label) from the engine's stats snapshot, and none while spec decoding is off."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from compiled_llm.engine.core import EngineStats
from compiled_llm.entrypoints.server.metrics import ServerMetrics


@dataclass
class _Engine:
    stats: EngineStats


def _samples(stats: EngineStats) -> dict[tuple[str, str], float]:
    metrics = ServerMetrics("m")
    metrics.bind(_Engine(stats))
    text = metrics.render()[0].decode()
    return {(s.name, s.labels.get("position", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_spec_decode_counters_under_both_names():
    stats = EngineStats(spec_num_drafts=5, spec_num_draft_tokens=15,
                        spec_num_accepted_tokens=9, spec_accepted_per_pos=(5, 3, 1))
    samples = _samples(stats)
    for prefix in ("compiled_llm:", "vllm:"):
        assert samples[f"{prefix}spec_decode_num_drafts_total", ""] == 5
        assert samples[f"{prefix}spec_decode_num_draft_tokens_total", ""] == 15
        assert samples[f"{prefix}spec_decode_num_accepted_tokens_total", ""] == 9
        per_pos = [samples[f"{prefix}spec_decode_num_accepted_tokens_per_pos_total", str(i)]
                   for i in range(3)]
        assert per_pos == [5, 3, 1]


def test_no_spec_decode_family_when_off():
    assert not any("spec_decode" in name for name, _ in _samples(EngineStats()))
