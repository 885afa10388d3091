"""The ChatML-style test model served (tests/utils.make_chatml_checkpoint): an echoed text
prompt shows as sent (no BOS the tokenizer added), streamed text skips special added tokens,
a chat turn ends at the tokenizer's EOS, bad_words are never generated,
truncate_prompt_tokens keeps a prompt's last tokens and add_special_tokens puts the BOS before
a rendered chat (vLLM's fields)."""

from __future__ import annotations

import json

import pytest

from tests.entrypoints.server.inprocess import engine_args, serving
from tests.utils import make_chatml_checkpoint

BOS, IM_END, IM_START = 1, 2, 3


@pytest.fixture(scope="module")
def srv():
    with serving(engine_args(model=str(make_chatml_checkpoint()))) as server:
        yield server
        assert server.idle()


def test_echo_shows_the_prompt_as_sent(srv):
    body = srv.post("/v1/completions", {"prompt": "hello", "max_tokens": 2, "echo": True,
                                        "temperature": 0}).json()
    assert body["choices"][0]["text"].startswith("hello")
    ids = srv.post("/v1/completions", {"prompt": [1, 72, 73], "max_tokens": 0,
                                       "echo": True}).json()
    assert ids["choices"][0]["text"] == "<s>" + srv.post(
        "/detokenize", {"tokens": [72, 73]}).json()["prompt"]


def test_streamed_text_skips_special_added_tokens(srv):
    resp = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 3, "stream": True,
                                        "logit_bias": {str(IM_START): 100}})
    events = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == ""
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_a_chat_turn_ends_at_the_tokenizers_eos(srv):
    body = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
        "logit_bias": {str(IM_END): 100}}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 1


def test_bad_words_are_never_generated(srv):
    x_id = srv.post("/tokenize", {"prompt": "x", "add_special_tokens": False}).json()["tokens"]
    assert len(x_id) == 1
    body = {"prompt": "hi", "max_tokens": 4, "logit_bias": {str(x_id[0]): 100},
            "return_tokens_as_token_ids": False}
    forced = srv.post("/v1/completions", body).json()["choices"][0]["text"]
    assert forced == "xxxx"
    banned = srv.post("/v1/completions", {**body, "bad_words": ["x"]}).json()
    assert "x" not in banned["choices"][0]["text"]
    bad = srv.post("/v1/completions", {**body, "bad_words": [" "]})
    assert bad.status_code == 400 and "bad_words" in bad.json()["error"]["message"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(srv):
    long = "x" * 700  # past the model's 512 positions
    body = {"prompt": long, "max_tokens": 1}
    assert srv.post("/v1/completions", body).status_code == 400
    kept = srv.post("/v1/completions", {**body, "truncate_prompt_tokens": 5}).json()
    assert kept["usage"]["prompt_tokens"] == 5
    fits = srv.post("/v1/completions", {**body, "truncate_prompt_tokens": -1}).json()
    assert fits["usage"]["prompt_tokens"] == 511
    chat = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": long}],
                                             "max_tokens": 1, "truncate_prompt_tokens": 7})
    assert chat.json()["usage"]["prompt_tokens"] == 7
    bad = srv.post("/v1/completions", {**body, "truncate_prompt_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncate_prompt_tokens"


def test_truncate_prompt_tokens_keeps_a_text_prompts_bos(srv):
    """A text prompt is cut as vLLM's left-truncating tokenizer cuts it: the BOS the
    tokenizer adds stays first; without add_special_tokens, and for token ids, a plain cut."""
    text = "The quick brown fox jumps over the lazy dog. " * 3
    whole = srv.post("/tokenize", {"prompt": text}).json()["tokens"]
    assert whole[0] == BOS

    def kept(prompt, **extra) -> list[list[int]]:
        body = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                            "truncate_prompt_tokens": 4,
                                            "return_token_ids": True, **extra}).json()
        return [choice["prompt_token_ids"] for choice in body["choices"]]

    assert kept(text) == [[BOS, *whole[-3:]]]
    assert kept([text, text]) == [[BOS, *whole[-3:]]] * 2
    assert kept([whole]) == [whole[-4:]]
    assert kept(text, add_special_tokens=False) == [whole[-4:]]


def test_chat_adds_the_tokenizers_bos_only_when_asked(srv):
    """vLLM's add_special_tokens on chat and on /tokenize's messages: false by default (the
    template writes its own tokens), true puts the tokenizer's BOS before the rendered chat."""
    messages = [{"role": "user", "content": "hi"}]
    plain = srv.post("/tokenize", {"messages": messages}).json()["tokens"]
    added = srv.post("/tokenize", {"messages": messages, "add_special_tokens": True}).json()
    assert plain[0] == IM_START and added["tokens"] == [BOS, *plain]
    for special, ids in ((False, plain), (True, [BOS, *plain])):
        body = srv.post("/v1/chat/completions", {
            "messages": messages, "max_tokens": 1, "add_special_tokens": special,
            "return_token_ids": True}).json()
        assert body["prompt_token_ids"] == ids and body["usage"]["prompt_tokens"] == len(ids)
