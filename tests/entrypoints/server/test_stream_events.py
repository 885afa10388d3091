"""The streaming path's shortcut gives what the plain way gives: an event whose fixed fields
were encoded once is the text sse() makes."""

from __future__ import annotations

import pytest

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
