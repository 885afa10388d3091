"""vLLM's request fields on /v1/completions and /v1/chat/completions, honoured as vLLM does:
cache_salt (prefix-cache isolation), priority (with --scheduling-policy priority), and
return_token_ids / return_tokens_as_token_ids (token ids in bodies, streams and logprobs);
bad values are 400s naming the field."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from compiled_llm.entrypoints.server.params import sampling_params
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.entrypoints.server.inprocess import MODEL, engine_args, serving, sse_events

PROMPT = list(range(5, 45))  # 40 tokens: two full blocks of 16 reusable
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]
TOKEN_ID = re.compile(r"^token_id:(\d+)$")


@pytest.fixture(scope="module")
def srv():
    with serving(engine_args(), enable_prompt_tokens_details=True) as server:
        yield server
        assert server.idle()


def _cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def _refused(srv, path: str, body: dict, field: str) -> dict:
    r = srv.post(path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text
    return r.json()["error"]


# ----------------------------------------------------------------------------- cache_salt
def test_cache_salt_shares_blocks_only_with_the_same_salt(srv):
    def cached(**salt) -> int:
        body = {"prompt": PROMPT, "max_tokens": 1, **salt}
        return _cached(srv.post("/v1/completions", body).json())

    assert [cached(cache_salt="A"), cached(cache_salt="A"), cached(cache_salt="B")] \
        == [0, 32, 0]
    assert cached() == 0  # no salt shares nothing with a salted request
    chat = {"messages": [{"role": "user", "content": "The quick brown fox " * 8}],
            "max_tokens": 1, "cache_salt": "C"}
    first, again = (srv.post("/v1/chat/completions", chat).json() for _ in range(2))
    assert _cached(first) == 0 and _cached(again) >= 16
    other = srv.post("/v1/chat/completions", {**chat, "cache_salt": "D"}).json()
    assert _cached(other) == 0


@pytest.mark.parametrize("salt", ["", 5, ["A"]])
def test_a_bad_cache_salt_is_a_400_naming_it(srv, salt):
    _refused(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "cache_salt": salt},
             "cache_salt")
    _refused(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                           "cache_salt": salt}, "cache_salt")


# ----------------------------------------------------------------------------- priority
def test_priority_needs_the_priority_policy(srv):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": MESSAGES})):
        error = _refused(srv, path, {**body, "max_tokens": 1, "priority": 1}, "priority")
        assert "scheduling_policy" in error["message"]
        assert srv.post(path, {**body, "max_tokens": 1, "priority": 0}).status_code == 200
        _refused(srv, path, {**body, "max_tokens": 1, "priority": "high"}, "priority")


def test_priority_orders_admission_under_the_priority_policy():
    with serving(engine_args(scheduling_policy="priority", max_num_seqs=1)) as server:
        chat = server.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                                    "priority": 3})
        assert chat.status_code == 200, chat.text
        finished: list[str] = []

        async def one(client: httpx.AsyncClient, name: str, priority: int,
                      max_tokens: int = 4) -> None:
            r = await client.post(f"{server.url}/v1/completions", json={
                "model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                "ignore_eos": True, "priority": priority})
            assert r.status_code == 200, r.text
            finished.append(name)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=120) as client:
                # one long request (400 tokens) holds the only sequence slot; the other two are
                # sent together while it runs, so both wait for the slot whatever the host's
                # speed, and had they come before it, urgent would still lead late
                tasks = [asyncio.create_task(one(client, "first", 0, max_tokens=400))]
                deadline = time.monotonic() + 60
                while not server.engine._streams:  # registered as its add is queued
                    assert time.monotonic() < deadline and not tasks[0].done()
                    await asyncio.sleep(0.005)
                tasks.append(asyncio.create_task(one(client, "late", 5, max_tokens=16)))
                tasks.append(asyncio.create_task(one(client, "urgent", -5, max_tokens=16)))
                await asyncio.gather(*tasks)

        asyncio.run(main())
        # the lower value runs first (urgent may even preempt the long one)
        assert finished.index("urgent") < finished.index("late")
        assert server.idle()


# ----------------------------------------------------------------------------- token ids
def _text_of(srv, ids: list[int]) -> str:
    return srv.post("/detokenize", {"tokens": ids}).json()["prompt"]


def test_completions_return_token_ids(srv):
    body = {"prompt": PROMPT, "max_tokens": 5, "n": 2, "return_token_ids": True,
            "temperature": 1.0, "seed": 3, "ignore_eos": True}
    out = srv.post("/v1/completions", body).json()
    for choice in out["choices"]:
        assert choice["prompt_token_ids"] == PROMPT
        ids = choice["token_ids"]
        # sampled bytes may end mid-character: the text holds that back, a decode shows U+FFFD
        assert len(ids) == 5 and _text_of(srv, ids).startswith(choice["text"])
    plain = srv.post("/v1/completions", {**body, "return_token_ids": False}).json()
    assert "token_ids" not in plain["choices"][0]
    echo = srv.post("/v1/completions", {**body, "n": 1, "echo": True}).json()["choices"][0]
    assert echo["text"] == _text_of(srv, echo["token_ids"])  # vLLM: no echoed prompt text
    events = sse_events(srv.post("/v1/completions", {**body, "stream": True}))
    for index in (0, 1):
        chunks = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert chunks[0]["prompt_token_ids"] == PROMPT
        assert all(c["prompt_token_ids"] is None for c in chunks[1:])
        assert [t for c in chunks for t in c["token_ids"]] == out["choices"][index]["token_ids"]


def test_chat_returns_token_ids(srv):
    body = {"messages": MESSAGES, "max_tokens": 5, "return_token_ids": True,
            "temperature": 0.0}
    out = srv.post("/v1/chat/completions", body).json()
    assert len(out["prompt_token_ids"]) == out["usage"]["prompt_tokens"]
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == out["usage"]["completion_tokens"]
    assert choice["message"]["content"] == _text_of(srv, choice["token_ids"])
    assert "prompt_token_ids" not in srv.post("/v1/chat/completions",
                                              {**body, "return_token_ids": False}).json()
    events = sse_events(srv.post("/v1/chat/completions", {**body, "stream": True}))
    assert events[0]["prompt_token_ids"] == out["prompt_token_ids"]  # on the role chunk
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    ids = [t for e in events[1:] for t in e["choices"][0]["token_ids"]]
    assert ids == choice["token_ids"]  # greedy: the same reply
    assert all("prompt_token_ids" not in e for e in events[1:])


def test_tokens_as_token_ids_in_logprobs(srv):
    body = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "temperature": 0.0}
    choice = srv.post("/v1/completions", body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert [int(TOKEN_ID.match(t)[1]) for t in logprobs["tokens"]] == choice["token_ids"]
    assert all(TOKEN_ID.match(key) for top in logprobs["top_logprobs"] for key in top)
    echo = srv.post("/v1/completions", {**body, "echo": True}).json()["choices"][0]
    assert [int(TOKEN_ID.match(t)[1]) for t in echo["logprobs"]["tokens"]] \
        == PROMPT + echo["token_ids"]
    chat = {"messages": MESSAGES, "max_tokens": 4, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    for events in (sse_events(srv.post("/v1/chat/completions", {**chat, "stream": True})),
                   [{"choices": [c]} for c in srv.post("/v1/chat/completions", chat)
                    .json()["choices"]]):
        pieces = [c for e in events for c in e["choices"] if c.get("logprobs")]
        content = [item for c in pieces for item in c["logprobs"]["content"]]
        assert [int(TOKEN_ID.match(i["token"])[1]) for i in content] \
            == [t for c in pieces for t in c["token_ids"]]
        assert all(i["bytes"] == list(i["token"].encode()) for i in content)
        assert all(TOKEN_ID.match(top["token"]) for i in content for top in i["top_logprobs"])
    plain = srv.post("/v1/completions", {**body, "return_tokens_as_token_ids": False}).json()
    assert not any(TOKEN_ID.match(t) for t in plain["choices"][0]["logprobs"]["tokens"])


# ----------------------------------------------------------------------------- detokenizing
@pytest.mark.parametrize("value", [False, True])
def test_spaces_between_special_tokens_reaches_sampling_params(value):
    for req in (CompletionRequest(prompt="hi", spaces_between_special_tokens=value),
                ChatCompletionRequest(messages=MESSAGES, spaces_between_special_tokens=value)):
        assert sampling_params(req, 4, None, False).spaces_between_special_tokens is value


def test_spaces_between_special_tokens_is_accepted_and_checked(srv):
    for value in (False, True):
        body = {"prompt": "hi", "max_tokens": 2, "spaces_between_special_tokens": value}
        assert srv.post("/v1/completions", body).status_code == 200
    _refused(srv, "/v1/chat/completions", {"messages": MESSAGES,
                                           "spaces_between_special_tokens": "no"},
             "spaces_between_special_tokens")


# ----------------------------------------------------------------------------- logit_bias
def test_logit_bias_beyond_100_is_clamped(srv):
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0.0, "logit_bias": {"7": 500}}
    reply = srv.post("/v1/completions", {**body, "return_token_ids": True})
    assert reply.status_code == 200, reply.text  # vLLM clamps each bias to [-100, 100]
    assert reply.json()["choices"][0]["token_ids"] == [7, 7]
    _refused(srv, "/v1/completions", {**body, "logit_bias": {"x": 1}}, "logit_bias")


@pytest.mark.parametrize("body,field,value", [
    ({"max_tokens": 16.0}, "max_tokens", 16), ({"n": 2.0}, "n", 2),
    ({"logprobs": True}, "logprobs", 1), ({"seed": 7.0}, "seed", 7)])
def test_whole_number_counts_read_as_vllm_reads_them(body, field, value):
    """vLLM's lax int fields take 16.0 as 16 and true as 1; a fraction or a string is still a
    400 naming the field."""
    request = CompletionRequest.model_validate({"prompt": "hi", **body})
    assert getattr(request, field) == value and type(getattr(request, field)) is int
    for bad in (2.5, "2", "ten"):
        with pytest.raises(ValueError, match=field):
            CompletionRequest.model_validate({"prompt": "hi", field: bad})


def test_truncate_prompt_tokens_reads_as_a_lax_int_too():
    """The generation endpoints read vLLM's truncate_prompt_tokens extra as its lax int."""
    from compiled_llm.entrypoints.server.errors import OpenAIError
    from compiled_llm.entrypoints.server.params import truncated_prompt

    ids = list(range(10, 30))
    for value, kept in ((4.0, 4), (True, 1)):
        request = CompletionRequest.model_validate({"prompt": ids,
                                                    "truncate_prompt_tokens": value})
        assert truncated_prompt(request, ids, 64) == ids[-kept:]
    with pytest.raises(OpenAIError, match="truncate_prompt_tokens"):
        truncated_prompt(CompletionRequest.model_validate(
            {"prompt": ids, "truncate_prompt_tokens": 2.5}), ids, 64)
