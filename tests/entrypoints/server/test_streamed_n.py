"""Streamed chat and completions with n > 1 over the per-child outputs: each choice's pieces
join to its non-streamed text under its own index, each ends with its own finish_reason, and
usage (include_usage, continuous_usage_stats) counts every choice; best_of equal to n too."""

from __future__ import annotations

import pytest

from tests.entrypoints.server.inprocess import serving, sse_events

USER = [{"role": "user", "content": "Tell me a story"}]
USAGE = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def srv():
    with serving() as server:
        yield server
        assert server.idle()


def _stop(srv, path: str, body: dict, text) -> list[str]:
    """A character the first choice shows early: a stop string some choices meet."""
    first = text(srv.post(path, body).json()["choices"][0]).strip()
    return [first[1] if len(first) > 1 else first[0]]


def _check_usage(events: list[dict], index_of, whole: dict) -> None:
    """The last chunk carries the whole usage; continuous usage counts each choice's own."""
    *chunks, last = events
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    per_choice: dict[int, int] = {}
    for event in chunks:
        (choice,) = event["choices"]  # one choice a chunk
        index = index_of(choice)
        assert event["usage"]["completion_tokens"] >= per_choice.get(index, 0)
        per_choice[index] = event["usage"]["completion_tokens"]
    assert sum(per_choice.values()) == whole["usage"]["completion_tokens"]


def test_streamed_chat_n_choices(srv):
    body = {"messages": USER, "n": 3, "max_tokens": 10, "temperature": 1.0, "seed": 3}
    body["stop"] = _stop(srv, "/v1/chat/completions", body, lambda c: c["message"]["content"])
    whole = srv.post("/v1/chat/completions", body).json()
    events = sse_events(srv.post("/v1/chat/completions",
                              {**body, "stream": True, "stream_options": USAGE}))
    texts: dict[int, str] = {}
    reasons: dict[int, list] = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + \
                choice["delta"].get("content", "")
            reasons.setdefault(choice["index"], []).append(choice["finish_reason"])
    for choice in whole["choices"]:
        assert texts[choice["index"]] == choice["message"]["content"]
        mine = reasons[choice["index"]]  # the choice's last chunk alone names its end
        assert mine[-1] == choice["finish_reason"] and not any(mine[:-1])
    assert "stop" in {c["finish_reason"] for c in whole["choices"]}
    _check_usage(events, lambda c: c["index"], whole)


def test_streamed_completions_n_and_best_of(srv):
    body = {"prompt": ["The quick brown", "Once upon"], "n": 2, "best_of": 2,
            "max_tokens": 8, "temperature": 1.0, "seed": 5}
    body["stop"] = _stop(srv, "/v1/completions", body, lambda c: c["text"])
    whole = srv.post("/v1/completions", body).json()
    events = sse_events(srv.post("/v1/completions",
                              {**body, "stream": True, "stream_options": USAGE}))
    texts: dict[int, str] = {}
    ends: dict[int, str | None] = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            assert choice["index"] not in ends or ends[choice["index"]] is None
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            ends[choice["index"]] = choice["finish_reason"]
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2, 3]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert ends == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    _check_usage(events, lambda c: c["index"], whole)
