"""Stored responses on a live server through the official `openai` client: a response is kept
(store defaults to true, as OpenAI's), previous_response_id continues its conversation exactly
as sending the whole conversation would (greedy output and prompt length equal), instructions
are not carried over, GET and DELETE find it by id, store=false keeps nothing, and the store
is bounded (least recently used out)."""

from __future__ import annotations

import openai
import pytest

from compiled_llm.entrypoints.server.protocol import ChatMessage
from compiled_llm.entrypoints.server.responses_store import ResponseStore


def _create(client, server, **kwargs):
    return client.responses.create(model=server.model, temperature=0, max_output_tokens=6, **kwargs)


def test_previous_response_id_continues_the_conversation(client, server):
    first = _create(client, server, input="The quick", instructions="Be brief.")
    assert (
        first.store is True and client.responses.retrieve(first.id).output_text == first.output_text
    )
    chained = _create(client, server, input="And then?", previous_response_id=first.id)
    whole = _create(
        client,
        server,
        input=[
            {"role": "user", "content": "The quick"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"},
        ],
    )
    assert chained.previous_response_id == first.id
    assert chained.output_text == whole.output_text
    assert chained.usage.input_tokens == whole.usage.input_tokens  # no instructions carried


def test_streamed_responses_are_stored_and_chain(client, server):
    with client.responses.stream(
        model=server.model, input="The quick", temperature=0, max_output_tokens=6
    ) as stream:
        # cut by max_output_tokens, it ends with response.incomplete (no get_final_response)
        [first] = [event.response for event in stream if event.type == "response.incomplete"]
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = _create(client, server, input="More", previous_response_id=first.id)
    assert second.usage.input_tokens > first.usage.input_tokens + 2


def test_store_false_keeps_nothing_and_delete_forgets(client, server):
    unstored = _create(client, server, input="The quick", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        _create(client, server, input="x", previous_response_id=unstored.id)
    kept = _create(client, server, input="The quick")
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)


def test_store_is_bounded_least_recently_used_first():
    store = ResponseStore(max_entries=2, max_chars=10_000)
    turn = [ChatMessage(role="user", content="hi")]
    for rid in ("a", "b"):
        store.put(rid, {"id": rid}, turn)
    store.response("a")  # a is now the most recently used
    store.put("c", {"id": "c"}, turn)
    assert store.response("a") and store.response("c")
    with pytest.raises(Exception, match="'b' not found"):
        store.response("b")
    store.put("big", {"id": "x" * 20_000}, turn)  # larger than the whole store: not kept
    with pytest.raises(Exception, match="not found"):
        store.conversation("big")
