"""Bad input against a live server: each case gets an OpenAI error object with the right 4xx,
while a long streaming request keeps being served alongside."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.entrypoints.server.conftest import API_KEY, MAX_BODY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return ("/v1/chat/completions", {"messages": MSG, "max_tokens": 4, **kw})


def comp(**kw):
    return ("/v1/completions", {"prompt": "hi", "max_tokens": 4, **kw})


SCHEMA_BAD = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}
# (id, path, json body, expected status, expected param or None)
CASES = [
    ("wrong type max_tokens", *chat(max_tokens="ten"), 400, "max_tokens"),
    ("wrong type messages", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("wrong type temperature", *chat(temperature="hot"), 400, "temperature"),
    ("boolean is no number", *comp(min_p=False), 400, "min_p"),
    ("null n is its default, null prompt is not", *comp(n=None, prompt=None), 400,
     "prompt.str"),
    ("wrong type stream", *comp(stream="yes"), 400, "stream"),
    ("missing prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("unknown model", *chat(model="gpt-9"), 404, "model"),
    ("row16 prompt too long names prompt", *comp(prompt=[5] * 600), 400, "prompt"),
    ("chat too long", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "fox " * 600}]}, 400, "messages"),
    ("prompt + max_tokens too long", *comp(prompt=[5] * 500, max_tokens=50), 400, "max_tokens"),
    ("max_tokens 0", *chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", *comp(max_tokens=-3), 400, "max_tokens"),
    ("temperature negative", *chat(temperature=-0.5), 400, "temperature"),
    ("top_p zero", *chat(top_p=0), 400, "top_p"),
    ("top_p above one", *comp(top_p=1.5), 400, "top_p"),
    ("n zero", *chat(n=0), 400, "n"),
    ("presence_penalty range", *chat(presence_penalty=3), 400, "presence_penalty"),
    ("top_logprobs too many", *chat(logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    ("completion logprobs too many", *comp(logprobs=30), 400, "logprobs"),
    ("invalid json schema", *chat(response_format=SCHEMA_BAD), 400, "structured_outputs"),
    ("schema not json", *chat(guided_json="{not json"), 400, "guided_json"),
    ("unsupported regex", *comp(guided_regex="(?=a)b"), 400, "structured_outputs"),
    ("invalid grammar", *comp(guided_grammar="root ::= ("), 400, "structured_outputs"),
    ("empty choice", *comp(guided_choice=[]), 400, "guided_choice"),
    ("two constraints", *comp(guided_regex="a", guided_choice=["a"]), 400, "guided_choice"),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("empty role", "/v1/chat/completions", {"messages": [{"role": "", "content": "a"}]},
     400, "messages.0.role"),
    ("stream_options without stream", *chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("token id out of vocab", *comp(prompt=[1, 10 ** 6]), 400, "prompt"),
    ("empty prompt list", *comp(prompt=[]), 400, "prompt"),
    ("suffix unsupported", *comp(suffix="x"), 400, "suffix"),
    ("detokenize bad ids", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("tokenize neither", "/tokenize", {}, 400, "prompt"),
    # issue 12's table: each hostile value a 400 naming its field, never a 500
    ("row1 seed 2**64", *comp(seed=2 ** 64), 400, "seed"),
    ("row1 seed below int64", *chat(seed=-(2 ** 63) - 1), 400, "seed"),
    ("row1 top_k 2**63", *comp(top_k=2 ** 63), 400, "top_k"),
    ("row1 stop id outside vocab", *comp(stop_token_ids=[10 ** 6], min_tokens=1), 400,
     "stop_token_ids"),
    ("row1 logit_bias id outside vocab", *chat(logit_bias={"100000": 5}), 400, "logit_bias"),
    ("row1 logit_bias key not an id", *chat(logit_bias={"x": 5}), 400, "logit_bias"),
    ("row1 allowed id outside vocab", *comp(allowed_token_ids=[1, 10 ** 6]), 400,
     "allowed_token_ids"),
    ("row1 n over max_n_sequences", *comp(n=129), 400, "n"),
    ("row6 n 100000", *chat(n=100_000), 400, "n"),
    ("5000 stop strings", *comp(stop=[f"{i}" + "y" * 20 for i in range(5000)]), 400, "stop"),
    ("row4 tokenize over max_prompt_bytes", "/tokenize", {"prompt": "fox " * 9000}, 400,
     "prompt"),
    ("row7 prompt over max_prompt_bytes", *comp(prompt="fox " * 9000), 400, "prompt"),
    ("row8 surrogate prompt", *comp(prompt="a\ud800b"), 400, "prompt"),
    ("row8 surrogate in a prompt list", *comp(prompt=["ok", "\udfff"]), 400, "prompt.1"),
    ("row8 surrogate chat", *chat(messages=[{"role": "user", "content": "\ud800"}]), 400,
     "messages.0.content"),
    ("row8 surrogate stop", *chat(stop=["\ud800"]), 400, "stop.0"),
    ("row8 surrogate tokenize", "/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
    ("row8 surrogate schema", *comp(guided_json={"enum": ["\ud800"]}), 400,
     "guided_json.enum.0"),
    ("row2 schema over structured_outputs_max_bytes",
     *chat(guided_json={"type": "object", "properties": {
         f"p{i}": {"type": "string"} for i in range(3500)}}), 400, "structured_outputs"),
    ("row3 choices over structured_outputs_max_bytes",
     *comp(guided_choice=[f"choice {i}" for i in range(8000)]), 400, "structured_outputs"),
    ("row10 any_whitespace yes", *comp(structured_outputs={"json_object": True,
                                                           "any_whitespace": "yes"}), 400,
     "structured_outputs"),
    ("row14 max_completion_tokens 0", *chat(max_completion_tokens=0), 400,
     "max_completion_tokens"),
    ("row14 choice a string", *comp(structured_outputs={"choice": "abc"}), 400,
     "structured_outputs"),
    ("row15 bools as token ids", *comp(prompt=[True, 5]), 400, None),
    ("row5 chat_template_kwargs template untrusted",
     *chat(chat_template_kwargs={"chat_template": "{{ 'x' * 10 }}"}), 400, "chat_template"),
    ("row5 chat_template untrusted", *chat(chat_template="{{ 'x' }}"), 400, "chat_template"),
    ("chat_template_kwargs reserved", *chat(chat_template_kwargs={"tokenize": True}), 400,
     "chat_template_kwargs"),
]


def check_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.fixture(scope="module")
def background(server):
    """A long streaming request that must finish normally while the errors happen."""
    result = {}

    def run():
        body = {"model": server.model, "prompt": "The quick", "max_tokens": 300,
                "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH,
                          timeout=120) as r:
            result["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=run)
    t.start()
    yield result
    t.join(timeout=120)
    events = result["lines"]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, background, case):
    _, path, body, status, param = case
    body = {"model": server.model, **body} if path.startswith("/v1") else body
    # ASCII JSON: a lone surrogate travels as its escape, as a hostile client would send it
    r = httpx.post(f"{server.url}{path}", content=json.dumps(body).encode(),
                   headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    check_error(r, status, param)


def test_malformed_json(server, background):
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"messages": [',
                   headers={**AUTH, "Content-Type": "application/json"})
    assert "malformed JSON" in check_error(r, 400)["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": API_KEY}])
def test_api_key(server, background, headers):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MSG},
                   headers=headers)
    assert check_error(r, 401)["code"] == "invalid_api_key"


def test_oversized_body(server, background):
    big = {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=big, headers=AUTH)
    check_error(r, 413)

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(MAX_BODY // 10_000 + 2):
            yield b" " * 10_000

    r = httpx.post(f"{server.url}/v1/chat/completions", content=chunks(), headers=AUTH)
    check_error(r, 413)


def test_unknown_route_and_method(server, background):
    check_error(httpx.get(f"{server.url}/v1/nothing", headers=AUTH), 404)
    check_error(httpx.get(f"{server.url}/v1/chat/completions", headers=AUTH), 405)


def test_openai_client_raises_typed_errors(client, server, background):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, messages=MSG, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSG)
    ok = client.chat.completions.create(model=server.model, messages=MSG, max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_row15_chat_content_none_is_empty(server, background):
    bodies = [{"model": server.model, "messages": [{"role": "user", "content": content}],
               "max_tokens": 3, "temperature": 0} for content in (None, "")]
    none, empty = (httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH,
                              timeout=30) for body in bodies)
    assert none.status_code == 200, none.text
    assert none.json()["usage"] == empty.json()["usage"]
    assert none.json()["choices"][0]["message"] == empty.json()["choices"][0]["message"]


REJECTED = "compiled_llm:request_success_total[rejected]"


@pytest.mark.parametrize("case", [comp(stop_token_ids=[10 ** 6]), comp(seed=2 ** 64),
                                  comp(prompt=[5] * 600)],
                         ids=["by_the_engine", "by_sampling_params", "by_the_server"])
def test_row16_a_rejection_counts_once(server, background, case):
    path, body = case
    before = server.metrics()[REJECTED]
    r = httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, headers=AUTH)
    check_error(r, 400)
    assert server.metrics()[REJECTED] == before + 1


def test_rejections_counted_and_pool_empty(server, background):
    m = server.metrics()
    assert m["compiled_llm:request_success_total[rejected]"] >= 20
