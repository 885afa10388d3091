"""Prompt logprobs at the server, against transformers on the served checkpoint (float32):
/v1/completions echo + logprobs (max_tokens 0 and 1, streamed and not), the `prompt_logprobs`
field on both endpoints, and stream_options.continuous_usage_stats."""

from __future__ import annotations

import functools

import httpx
import pytest
import torch

from tests.entrypoints.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The quick brown fox jumps over the lazy dog"


@functools.cache
def _hf(model_dir: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _logprobs(server, ids: list[int]) -> torch.Tensor:
    """transformers' next-token logprobs after each prefix of ids."""
    with torch.no_grad():
        return _hf(server.model)(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def _reference(server, ids: list[int]) -> list[float]:
    """transformers' logprob of each prompt token after the first, given its prefix."""
    logits = _logprobs(server, ids)
    return logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def _ids(server, text: str) -> list[int]:
    body = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, headers=AUTH).json()
    return body["tokens"]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_score_the_prompt(client, server, max_tokens):
    ids = _ids(server, PROMPT)
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=max_tokens,
                                    echo=True, logprobs=2, temperature=0)
    choice = out.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + max_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.tokens[0] == PROMPT[: len(lp.tokens[0])] and lp.text_offset[0] == 0
    torch.testing.assert_close(lp.token_logprobs[1:len(ids)], _reference(server, ids),
                               atol=1e-4, rtol=1e-4)
    # top_logprobs: the token's own, then the 2 best (keyed by text, so tokens decoding alike
    # share a key)
    best = _logprobs(server, ids).topk(2).values
    for pos, top in enumerate(lp.top_logprobs[1:len(ids)]):
        own, *rest = top.items()
        assert 1 <= len(top) <= 3 and own == (lp.tokens[pos + 1], lp.token_logprobs[pos + 1])
        assert all(torch.isclose(best[pos], torch.tensor(v), atol=1e-4).any() for _, v in rest)
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert choice.text.startswith(PROMPT) and (max_tokens or choice.text == PROMPT)
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == max_tokens
    assert choice.finish_reason == "length"
    prompt_rows = choice.model_extra["prompt_logprobs"]
    assert prompt_rows[0] is None and len(prompt_rows) == len(ids)
    assert [row[str(t)]["logprob"] for row, t in zip(prompt_rows[1:], ids[1:])] == \
        lp.token_logprobs[1:len(ids)]


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echo_logprobs_stream_matches_body(client, server, max_tokens):
    kw = dict(model=server.model, prompt=[PROMPT, "Permission is"], max_tokens=max_tokens,
              echo=True, logprobs=1, temperature=0)
    body = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    for choice in body.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        tokens = [t for c in mine for t in c.logprobs.tokens]
        values = [v for c in mine for v in c.logprobs.token_logprobs]
        # the first piece holds the whole prompt; later offsets count the text streamed
        first = mine[0].logprobs.text_offset
        assert tokens == choice.logprobs.tokens and first == choice.logprobs.text_offset[
            :len(first)]
        assert values[0] is None
        torch.testing.assert_close(values[1:], choice.logprobs.token_logprobs[1:], atol=1e-5,
                                   rtol=1e-5)  # batched with the other prompt or not


def test_prompt_logprobs_field_on_both_endpoints(client, server):
    ids = _ids(server, PROMPT)
    out = client.completions.create(model=server.model, prompt=ids, max_tokens=2,
                                    extra_body={"prompt_logprobs": 3})
    rows = out.choices[0].model_extra["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    got = [rows[i][str(t)]["logprob"] for i, t in enumerate(ids) if i]
    torch.testing.assert_close(got, _reference(server, ids), atol=1e-4, rtol=1e-4)
    assert all(1 <= len(row) <= 4 and all(v["decoded_token"] is not None for v in row.values())
               for row in rows[1:])
    assert out.choices[0].logprobs is None  # prompt_logprobs alone asks for no sample logprobs
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=server.model, messages=messages, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    chat_ids = httpx.post(f"{server.url}/tokenize", json={"messages": messages},
                          headers=AUTH).json()["tokens"]
    rows = chat.model_extra["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(chat_ids) == chat.usage.prompt_tokens
    got = [rows[i][str(t)]["logprob"] for i, t in enumerate(chat_ids) if i]
    torch.testing.assert_close(got, _reference(server, chat_ids), atol=1e-4, rtol=1e-4)
    plain = client.chat.completions.create(model=server.model, messages=messages, max_tokens=1)
    assert plain.model_extra["prompt_logprobs"] is None


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_refused_when_streaming(server, path):
    body = {"model": server.model, "max_tokens": 2, "stream": True, "prompt_logprobs": 1,
            **({"prompt": PROMPT} if "chat" not in path else
               {"messages": [{"role": "user", "content": PROMPT}]})}
    r = httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_max_tokens_zero_needs_echo(server):
    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=30,
                   json={"model": server.model, "prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_continuous_usage_stats(client, server):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=6, stream=True, stream_options=options,
        extra_body={"ignore_eos": True}))
    ids = _ids(server, PROMPT)
    with_choice = [c for c in chunks if c.choices]
    assert all(c.usage.prompt_tokens == len(ids) for c in chunks)
    counts = [c.usage.completion_tokens for c in with_choice]
    assert counts == sorted(counts) and counts[-1] == 6 == chunks[-1].usage.completion_tokens
    chat = list(client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=5,
        stream=True, stream_options=options, extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chat)
    assert chat[0].usage.completion_tokens == 0 and chat[-2].usage.completion_tokens == 5
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 5
    # vLLM: continuous_usage_stats counts only together with include_usage
    alone = list(client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=3, stream=True,
        stream_options={"continuous_usage_stats": True}))
    assert all(c.usage is None for c in alone)
