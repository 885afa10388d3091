"""Stored responses on a live server through the official `openai` client: a response is kept
(store defaults to true, as OpenAI's), previous_response_id continues its conversation exactly
as sending the whole conversation would (greedy output and prompt length equal), instructions
are not carried over, GET and DELETE find it by id, store=false keeps nothing, and the store
is bounded (least recently used out)."""

from __future__ import annotations

import os

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
        # cut by max_output_tokens, it still ends with response.completed (as vLLM's)
        first = stream.get_final_response()
    assert first.status == "incomplete"
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


def test_api_server_processes_share_what_they_store(tmp_path):
    """Several API server processes (the default on a big CUDA host) answer one client: a
    response one of them kept is found, continued and deleted through any other."""
    first, second = (ResponseStore(directory=str(tmp_path)) for _ in range(2))
    turn = [ChatMessage(role="user", content="hi"),
            ChatMessage(role="assistant", content="hello", reasoning_content="think")]
    first.put("resp_1", {"id": "resp_1"}, turn)
    assert second.response("resp_1") == {"id": "resp_1"}
    assert [m.model_dump() for m in second.conversation("resp_1")] == [
        m.model_dump() for m in turn]
    assert second.delete("resp_1")
    for store in (first, second):
        with pytest.raises(Exception, match="not found"):
            store.response("resp_1")
    with pytest.raises(Exception, match="not found"):  # never a path outside the directory
        second.response("../resp_1")
    bounded = ResponseStore(max_entries=1, directory=str(tmp_path))
    bounded.put("r1", {"id": "r1"}, turn)
    bounded.put("r2", {"id": "r2"}, turn)  # evicts r1 here and for the others
    with pytest.raises(Exception, match="not found"):
        second.response("r1")
    assert sorted(os.listdir(tmp_path)) == ["r2.json"]
