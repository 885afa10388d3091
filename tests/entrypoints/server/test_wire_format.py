"""Wire details as vLLM's server has them: stop_reason on a streamed choice's last chunk, model
cards' root and permission, text-like content parts read as text, ignored fields named in a
warning, any role reaching the template, request_id naming the reply, and every field of vLLM's
chat message (unset ones null, tool_calls empty)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.server.inprocess import MODEL, serving

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv():
    with serving() as server:
        yield server
        assert server.idle()


def _events(resp) -> list[dict]:
    return [json.loads(line[6:]) for line in resp.text.splitlines()
            if line.startswith("data: {")]


def _get(srv, path: str) -> dict:
    return httpx.get(f"{srv.url}{path}", headers=srv.headers, timeout=30).json()


def test_streamed_chat_names_the_stop_reason_on_the_last_chunk(srv):
    x = srv.post("/tokenize", {"prompt": "x", "add_special_tokens": False}).json()["tokens"]
    body = {"messages": USER, "max_tokens": 5, "stop": ["x"], "logit_bias": {str(x[0]): 100}}
    whole = srv.post("/v1/chat/completions", body).json()["choices"][0]
    assert (whole["finish_reason"], whole["stop_reason"]) == ("stop", "x")
    events = _events(srv.post("/v1/chat/completions", {**body, "stream": True, "n": 2}))
    last = {c["index"]: c for e in events for c in e["choices"] if c["finish_reason"]}
    assert {i: (c["finish_reason"], c["stop_reason"]) for i, c in last.items()} == {
        0: ("stop", "x"), 1: ("stop", "x")}
    # a chunk before the last has no stop_reason, as vLLM's (unset, so absent)
    assert not any("stop_reason" in c for e in events for c in e["choices"]
                   if not c["finish_reason"])


def test_model_cards_have_the_model_path_as_root_and_a_permission(srv):
    listed = _get(srv, "/v1/models")["data"]
    assert [card["id"] for card in listed] == [MODEL]
    card = listed[0]
    assert card["root"] == srv.engine.engine.args.model  # --model, not the served name
    (permission,) = card["permission"]
    assert permission["object"] == "model_permission" and permission["id"].startswith(
        "modelperm-")
    assert permission["allow_sampling"] and permission["allow_logprobs"]
    assert _get(srv, f"/v1/models/{MODEL}") == card


def test_text_like_content_parts_are_read_as_text(srv):
    def tokens(messages) -> list[int]:
        resp = srv.post("/tokenize", {"messages": messages, "add_generation_prompt": False})
        assert resp.status_code == 200, resp.text
        return resp.json()["tokens"]

    parts = [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                          {"type": "output_text", "text": "b"}]},
             {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]
    plain = [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "no"}]
    assert tokens(parts) == tokens(plain)
    resp = srv.post("/v1/chat/completions", {"messages": parts, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    bad = srv.post("/v1/chat/completions", {"messages": [
        {"role": "assistant", "content": [{"type": "refusal"}]}], "max_tokens": 1})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "messages[0].content[0].refusal"


def test_ignored_fields_are_named_in_a_warning(srv, caplog):
    with caplog.at_level("WARNING", logger="compiled_llm.entrypoints.server.unsupported"):
        resp = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 1, "max_token": 9,
                                            "bad_words": ["zz"], "use_beam_search": False})
    assert resp.status_code == 200, resp.text
    warned = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert warned == ["The following fields were present in the request but ignored: "
                      "['max_token']"]


def test_any_role_reaches_the_chat_template(srv):
    messages = [{"role": "user", "content": "a"}, {"role": "ipython", "content": "42"}]
    resp = srv.post("/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert resp.status_code == 200, resp.text
    text = srv.post("/detokenize", {"tokens": resp.json()["tokens"]}).json()["prompt"]
    assert "ipython" in text  # the ChatML template writes the role it was given
    resp = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert resp.status_code == 200, resp.text


def test_a_named_request_keeps_its_name_in_the_reply_id(srv):
    body = {"messages": USER, "max_tokens": 1}
    assert srv.post("/v1/chat/completions", {**body, "request_id": "abc"}).json()["id"] \
        == "chatcmpl-abc"
    resp = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "a", "max_tokens": 1},
                      headers={**srv.headers, "X-Request-Id": "xyz"}, timeout=30)
    assert resp.json()["id"] == "cmpl-xyz"
    # one name twice: both served (the engine's ids stay apart)
    streamed = [srv.post("/v1/chat/completions", {**body, "request_id": "same", "stream": True})
                for _ in range(2)]
    assert all(_events(r)[0]["id"] == "chatcmpl-same" for r in streamed)


def test_a_chat_message_has_every_field_of_vllms(srv):
    message = srv.post("/v1/chat/completions", {"messages": USER, "max_tokens": 2}).json()[
        "choices"][0]["message"]
    assert message["tool_calls"] == [] and message["reasoning_content"] is None
    assert {"refusal", "annotations", "audio", "function_call", "reasoning"} <= set(message)
    # the reply sent back as history (its empty tool_calls with it) renders as a plain one
    again = [*USER, message, {"role": "user", "content": "and?"}]
    plain = [*USER, {"role": "assistant", "content": message["content"]},
             {"role": "user", "content": "and?"}]
    tokens = [srv.post("/tokenize", {"messages": m}).json()["tokens"] for m in (again, plain)]
    assert tokens[0] == tokens[1]
