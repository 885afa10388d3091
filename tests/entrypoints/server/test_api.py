"""The OpenAI API of a live server through the official `openai` client: chat and completions,
streamed and not, n, logprobs, stop strings, seeds, usage, and the auxiliary endpoints."""

from __future__ import annotations

import httpx
import pytest

from tests.entrypoints.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}  # every route but /health, /metrics, /ping

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick"}]


def _chat(client, server, **kw):
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=server.model, messages=CHAT, **kw)


def test_models_health_tokenize_detokenize(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [server.model]
    assert httpx.get(f"{server.url}/health").status_code == 200
    text = "The quick brown fox"
    tok = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, headers=AUTH).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 512
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": tok["tokens"]},
                      headers=AUTH).json()
    assert back["prompt"] == text
    chat_tok = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT},
                          headers=AUTH).json()
    usage = _chat(client, server, max_tokens=1).usage
    assert usage.prompt_tokens == chat_tok["count"]


def test_chat_stream_matches_non_stream(client, server):
    full = _chat(client, server, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3)
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    assert len(choice.logprobs.content) == full.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in choice.logprobs.content)
    chunks = list(_chat(client, server, temperature=0, max_tokens=16, stream=True,
                        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == choice.finish_reason and not any(finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens


def test_chat_n_seed_and_length(client, server):
    kw = dict(n=3, temperature=1.0, seed=7, max_tokens=10, extra_body={"ignore_eos": True})
    a, b = _chat(client, server, **kw), _chat(client, server, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1  # children get distinct seeds
    assert all(c.finish_reason == "length" for c in a.choices)
    assert a.usage.completion_tokens == 30


def test_completions_batch_n_logprobs_and_stream(client, server):
    prompts = ["The quick brown", "Permission is hereby"]
    # n > 1 samples (vLLM refuses it greedy); child i draws with seed 5 + i
    full = client.completions.create(model=server.model, prompt=prompts, n=2, max_tokens=8,
                                     temperature=1.0, seed=5, logprobs=2)
    assert [c.index for c in full.choices] == [0, 1, 2, 3]
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == 0
    texts: dict[int, str] = {}
    for chunk in client.completions.create(model=server.model, prompt=prompts, n=2,
                                           max_tokens=8, temperature=1.0, seed=5, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(4)] == [c.text for c in full.choices]
    echo = client.completions.create(model=server.model, prompt=prompts[0], max_tokens=4,
                                     temperature=1.0, seed=5, echo=True)
    assert echo.choices[0].text == prompts[0] + full.choices[0].text[: len(
        echo.choices[0].text) - len(prompts[0])]


def test_token_prompt_penalties_and_user(client, server):
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "The quick"},
                     headers=AUTH).json()["tokens"]
    by_ids = client.completions.create(model=server.model, prompt=ids, max_tokens=6,
                                       temperature=0)
    by_text = client.completions.create(model=server.model, prompt="The quick", max_tokens=6,
                                        temperature=0, user="tester")
    assert by_ids.choices[0].text == by_text.choices[0].text
    pen = client.completions.create(model=server.model, prompt="The quick", max_tokens=24,
                                    temperature=0, frequency_penalty=2.0, presence_penalty=2.0,
                                    top_p=0.5, extra_body={"ignore_eos": True})
    assert pen.usage.completion_tokens == 24


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_never_leaks(client, server, stream):
    base = client.completions.create(model=server.model, prompt="The quick", max_tokens=24,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if len(stop) < 2 or stop.isspace():
        pytest.skip("greedy output too short for a stop string")
    kw = dict(model=server.model, prompt="The quick", max_tokens=24, temperature=0,
              stop=[stop], extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        got = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw)
        got, reason = r.choices[0].text, r.choices[0].finish_reason
    assert got == text[: text.index(stop)] and reason == "stop"


def test_api_key_only_guards_v1(server):
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    ok = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_completion_top_logprobs_hold_the_chosen_token(client, server, stream):
    # OpenAI and vLLM: up to logprobs + 1 entries, the chosen token's always among them
    for num in (0, 2):
        kw = dict(model=server.model, prompt="The quick", max_tokens=6, logprobs=num,
                  extra_body={"ignore_eos": True})
        out = client.completions.create(stream=stream, **kw)
        chunks = list(out) if stream else [out]
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        rows = [row for lp in lps for row in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)]
        assert len(rows) == 6
        for token, logprob, top in rows:
            assert 1 <= len(top) <= num + 1 and top[token] == logprob
            assert next(iter(top)) == token  # the chosen token first, as vLLM
        if num == 0:
            assert all(len(top) == 1 for _, _, top in rows)


def test_null_fields_mean_their_defaults(client, server):
    # clients send null for "unset"; vLLM reads it as the field's default
    chat = _chat(client, server, n=None, logprobs=None, top_logprobs=None, stream=None,
                 presence_penalty=None, frequency_penalty=None, max_tokens=3,
                 extra_body={"add_generation_prompt": None, "ignore_eos": None})
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None
    assert chat.usage.completion_tokens <= 3
    comp = client.completions.create(model=server.model, prompt="The quick", max_tokens=3,
                                     n=None, echo=None, stream=None, presence_penalty=None,
                                     extra_body={"min_tokens": None})
    assert len(comp.choices) == 1 and not comp.choices[0].text.startswith("The quick")
    # where null has a meaning of its own, it keeps it: max_tokens null is "to the end"
    rest = client.completions.create(model=server.model, prompt="The quick", max_tokens=None,
                                     extra_body={"ignore_eos": True})
    assert rest.usage.total_tokens == 512 and rest.choices[0].finish_reason == "length"
