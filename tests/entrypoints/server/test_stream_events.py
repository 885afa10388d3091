"""The streaming path's shortcuts give what the plain way gives: an event whose fixed fields
were encoded once is the text sse() makes, and one bulk histogram update is `count`
observations."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from compiled_llm.entrypoints.server.metrics import _LATENCY, observe_many
from compiled_llm.entrypoints.server.streaming import choice_events, sse

FIELDS = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m/é"}


@pytest.mark.parametrize("choices", [
    [], [{"index": 0, "text": "héllo \u2028 \"q\"\n", "logprobs": None, "finish_reason": None}],
    [{"index": 1, "delta": {}, "logprobs": {"content": []}, "finish_reason": "length"}],
])
def test_choice_events_are_the_events_sse_makes(choices):
    event = choice_events(FIELDS)
    assert event(choices) == sse({**FIELDS, "choices": choices})
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert event(choices, usage=usage) == sse({**FIELDS, "choices": choices, "usage": usage})


def _histogram():
    registry = CollectorRegistry()
    return registry, Histogram("itl", "doc", buckets=_LATENCY, registry=registry)


@pytest.mark.parametrize("value", [0.0, 0.001, 0.003, 0.07, 3.0, 500.0])
def test_observe_many_is_count_observations(value):
    (bulk_registry, bulk), (loop_registry, loop) = _histogram(), _histogram()
    for count in (1, 5):
        observe_many(bulk, value, count)
        for _ in range(count):
            loop.observe(value)
    assert _samples(bulk_registry) == _samples(loop_registry)


def _samples(registry: CollectorRegistry) -> list:
    return [(sample.name, sample.labels, sample.value) for family in registry.collect()
            for sample in family.samples if not sample.name.endswith("_created")]
