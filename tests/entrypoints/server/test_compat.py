"""vLLM-compatible extras on the live server: GET /v1/models/{id}, /tokenizer_info, /version,
/ping, the `vllm:` Prometheus names beside the server's own, the docs pages, and vLLM's
server-wide flags for usage and token ids."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from compiled_llm.entrypoints.server.vllm_metrics import ALIASES
from tests.entrypoints.server.conftest import API_KEY
from tests.entrypoints.server.inprocess import MODEL, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_models_retrieve(client, server):
    card = client.models.retrieve(server.model)
    assert card.id == server.model and card.object == "model"
    assert card.model_extra["max_model_len"] == 512
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    assert httpx.get(f"{server.url}/v1/models/{server.model}").status_code == 401  # keyed


def test_tokenizer_info_matches_the_tokenizer(server):
    import transformers

    info = httpx.get(f"{server.url}/tokenizer_info", headers=AUTH).json()
    tok = transformers.AutoTokenizer.from_pretrained(server.model)
    assert info["tokenizer_class"] == type(tok).__name__
    assert info["eos_token"] == tok.eos_token and info["bos_token"] is None
    assert info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == 512
    assert info["added_tokens_decoder"] == {"0": "<|endoftext|>"}


def test_version_and_ping_need_no_key(server):
    import compiled_llm

    assert httpx.get(f"{server.url}/version").json() == {"version": compiled_llm.__version__}
    assert httpx.get(f"{server.url}/ping").status_code == 200
    assert httpx.post(f"{server.url}/ping").status_code == 200


def _families(server) -> dict:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def _values(family) -> dict:
    """(name less prefix, labels less vLLM's engine) -> value of each sample."""
    return {(s.name.split(":", 1)[1],
             tuple(sorted((k, v) for k, v in s.labels.items() if k != "engine"))): s.value
            for s in family.samples}


def test_vllm_metric_names_mirror_the_servers_own(client, server):
    prompt = "Permission is hereby granted, free of charge, to any person obtaining a copy"
    for _ in range(2):  # the second finds the first's blocks in the prefix cache
        client.completions.create(model=server.model, prompt=prompt, max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt=prompt, max_tokens=-1)
    server.wait_idle()
    families = _families(server)
    for source, aliases in ALIASES.items():
        if source.startswith("spec_decode_"):
            continue  # exported with speculative decoding only (test_spec_metrics.py)
        ours = families[f"compiled_llm:{source}"]
        for alias in aliases:
            theirs = families[alias.name]
            assert theirs.type == (alias.type or ours.type)
            assert all(s.labels["model_name"] == server.model and s.labels["engine"] == "0"
                       for s in theirs.samples)
            if alias.type is None and not alias.labels:
                assert _values(theirs) == {(name.replace(source, alias.name[5:], 1), labels): v
                                           for (name, labels), v in _values(ours).items()}
    success = {s.labels["finished_reason"]: s.value
               for s in families["vllm:request_success"].samples if s.name.endswith("_total")}
    assert set(success) == {"stop", "length", "abort", "error"} and success["length"] >= 2
    hits = families["vllm:prefix_cache_hits"].samples[0].value
    assert 16 <= hits <= families["vllm:prefix_cache_queries"].samples[0].value
    preempt = families["vllm:num_preemptions"]
    assert preempt.samples[0].name == "vllm:num_preemptions_total"


def test_models_retrieve_shows_the_root_as_the_list_does(client, server):
    listed = {card.id: card for card in client.models.list().data}
    card = client.models.retrieve(server.model)
    assert card.model_dump() == listed[server.model].model_dump()


def test_continue_final_message(client, server):
    messages = [{"role": "user", "content": "Go on"},
                {"role": "assistant", "content": "The quick brown"}]

    def tokenize(**kw) -> dict:
        return httpx.post(f"{server.url}/tokenize", json={"messages": messages, **kw},
                          headers=AUTH).json()

    cont = tokenize(add_generation_prompt=False, continue_final_message=True,
                    return_token_strs=True)
    closed = tokenize(add_generation_prompt=False)
    # the prompt stops inside the assistant's message: the template's closing "\n" is cut
    assert closed["tokens"][:cont["count"]] == cont["tokens"]
    assert cont["count"] < closed["count"]
    assert len(cont["token_strs"]) == cont["count"] and "token_strs" not in closed
    out = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=4,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert out.usage.prompt_tokens == cont["count"] and out.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as err:  # as vLLM: not both
        client.chat.completions.create(model=server.model, messages=messages, max_tokens=4,
                                       extra_body={"continue_final_message": True})
    assert err.value.body["param"] == "continue_final_message"


def test_chat_echo_leads_with_the_last_message_of_the_replys_role(client, server):
    messages = [{"role": "user", "content": "Go on"},
                {"role": "assistant", "content": "The quick brown"}]
    cont = {"add_generation_prompt": False, "continue_final_message": True}

    def chat(msgs, **extra):
        return client.chat.completions.create(model=server.model, messages=msgs, max_tokens=4,
                                              temperature=0, extra_body=extra)

    plain = chat(messages, **cont).choices[0].message.content
    assert chat(messages, **cont, echo=True).choices[0].message.content == \
        "The quick brown" + plain
    # as vLLM: the reply's role is the assistant's after a generation prompt, else the last
    # message's own; the last message is echoed when it has that role
    assert chat(messages, echo=True).choices[0].message.content == \
        "The quick brown" + chat(messages).choices[0].message.content
    assert chat(messages[:1], echo=True).choices[0].message.content == \
        chat(messages[:1]).choices[0].message.content
    assert chat(messages[:1], add_generation_prompt=False, echo=True).choices[0].message \
        .content.startswith("Go on")
    stream = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=4, temperature=1.0, seed=9, n=2,
        stream=True, extra_body={**cont, "echo": True})
    # child i samples with seed 9 + i (vLLM's n > 1 needs sampling)
    plain = [client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=4, temperature=1.0, seed=9 + index,
        extra_body=cont).choices[0].message.content for index in (0, 1)]
    deltas: dict[int, list] = {0: [], 1: []}
    for event in stream:
        for choice in event.choices:
            deltas[choice.index].append(choice.delta)
    for index in (0, 1):  # the role, then the echoed message, then the reply
        first, echoed, *rest = deltas[index]
        assert first.role == "assistant" and echoed.content == "The quick brown"
        assert "".join(d.content or "" for d in rest) == plain[index]
    bad = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, json={
        "model": server.model, "messages": messages, "echo": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "echo", bad.text


def test_chat_reply_role_is_the_last_messages_without_a_generation_prompt(client, server):
    # as vLLM's get_chat_request_role: "assistant" after a generation prompt, else the role
    # of the last message (the reply continues it), in the message and the first delta
    def roles(messages, **extra) -> tuple[str, str]:
        kw = dict(model=server.model, messages=messages, max_tokens=2, extra_body=extra)
        full = client.chat.completions.create(**kw).choices[0].message.role
        with client.chat.completions.create(**kw, stream=True) as stream:
            first = next(iter(stream))
        return full, first.choices[0].delta.role

    user = [{"role": "user", "content": "Go on"}]
    assistant = [*user, {"role": "assistant", "content": "The quick"}]
    assert roles(user) == ("assistant", "assistant")
    assert roles(user, add_generation_prompt=False) == ("user", "user")
    assert roles([{"role": "system", "content": "Be brief."}],
                 add_generation_prompt=False) == ("system", "system")
    assert roles(assistant, add_generation_prompt=False,
                 continue_final_message=True) == ("assistant", "assistant")


def test_chat_text_parts_are_joined_by_newlines(client, server):
    # as vLLM's "string" content format: the template sees the text parts joined by "\n"
    def tokens(content) -> list[int]:
        return httpx.post(f"{server.url}/tokenize", headers=AUTH, json={
            "messages": [{"role": "user", "content": content}],
            "add_generation_prompt": False}).json()["tokens"]

    parts = [{"type": "text", "text": "The quick"}, {"type": "text", "text": "brown fox"}]
    assert tokens(parts) == tokens("The quick\nbrown fox") != tokens("The quickbrown fox")
    out = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": parts}], max_tokens=2,
        extra_body={"add_generation_prompt": False, "echo": True})
    assert out.usage.prompt_tokens == len(tokens("The quick\nbrown fox"))
    assert out.choices[0].message.content.startswith("The quick\nbrown fox")  # echo, joined


def test_docs_pages_served_unless_disabled_and_root_path():
    """/openapi.json, /docs and /redoc as FastAPI serves them by default;
    disable_fastapi_docs removes all three; root_path names the proxy's prefix in the spec."""
    with serving(root_path="/proxy") as srv:
        for path in ("/docs", "/redoc"):
            r = httpx.get(f"{srv.url}{path}")
            assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        spec = httpx.get(f"{srv.url}/openapi.json").json()
        assert spec["servers"] == [{"url": "/proxy"}]
        assert httpx.get(f"{srv.url}/v1/models").status_code == 200
    with serving(disable_fastapi_docs=True) as srv:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert httpx.get(f"{srv.url}{path}").status_code == 404
        assert httpx.get(f"{srv.url}/v1/models").status_code == 200


def _events(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_server_wide_usage_and_token_ids():
    """--enable-force-include-usage ends every stream with its usage chunk (no
    stream_options needed); --return-tokens-as-token-ids shows logprobs' tokens as ids."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "logprobs": True, "top_logprobs": 1}
    completion = {"model": MODEL, "prompt": "The quick", "max_tokens": 3, "logprobs": 1}
    with serving(enable_force_include_usage=True, return_tokens_as_token_ids=True) as srv:
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
            events = _events(httpx.post(f"{srv.url}{path}", json={**body, "stream": True},
                                        timeout=60))
            assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
            assert all("usage" not in event for event in events[:-1])
        content = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=60).json()[
            "choices"][0]["logprobs"]["content"]
        assert all(entry["token"].startswith("token_id:") for entry in content)
        tokens = httpx.post(f"{srv.url}/v1/completions", json=completion, timeout=60).json()[
            "choices"][0]["logprobs"]["tokens"]
        assert len(tokens) == 3 and all(token.startswith("token_id:") for token in tokens)
        own = {**completion, "return_tokens_as_token_ids": False}  # a request's own wins
        tokens = httpx.post(f"{srv.url}/v1/completions", json=own, timeout=60).json()[
            "choices"][0]["logprobs"]["tokens"]
        assert not any(token.startswith("token_id:") for token in tokens)
        responses = {"model": MODEL, "input": "hi", "max_output_tokens": 3, "top_logprobs": 1,
                     "include": ["message.output_text.logprobs"]}
        reply = httpx.post(f"{srv.url}/v1/responses", json=responses, timeout=60).json()
        content = reply["output"][-1]["content"][0]["logprobs"]
        assert content and all(entry["token"].startswith("token_id:") for entry in content)
    with serving() as srv:  # the defaults: no usage chunk unless asked, tokens as text
        events = _events(httpx.post(f"{srv.url}/v1/completions",
                                    json={**completion, "stream": True}, timeout=60))
        assert all("usage" not in event or event["usage"] is None for event in events)


PARTS_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{% for p in m['content'] %}"
                  "{{ p['text'] }}{% endfor %}\n{% endfor %}")


def test_chat_template_content_format_openai_gives_the_template_text_parts():
    """--chat-template-content-format openai: a template that iterates over content parts
    reads each message's text; auto (the default) finds that the template reads parts, as
    vLLM's does; string gives it strings (it reads none)."""
    messages = [{"role": "user", "content": "hello there"}]

    def rendered(srv) -> str:
        ids = httpx.post(f"{srv.url}/tokenize", json={"model": MODEL, "messages": messages,
                                                      "add_generation_prompt": False}).json()
        return httpx.post(f"{srv.url}/detokenize",
                          json={"model": MODEL, "tokens": ids["tokens"]}).json()["prompt"]

    with serving(chat_template=PARTS_TEMPLATE, chat_template_content_format="openai") as srv:
        assert rendered(srv).strip() == "<user>hello there"
    with serving(chat_template=PARTS_TEMPLATE) as srv:  # auto: detected
        assert rendered(srv).strip() == "<user>hello there"
        messages = [{"role": "user", "content": [{"type": "text", "text": "hello "},
                                                 {"type": "text", "text": "there"}]}]
        assert rendered(srv).strip() == "<user>hello there"  # each part its own, not joined
        messages = [{"role": "user", "content": "hello there"}]
    with serving(chat_template=PARTS_TEMPLATE, chat_template_content_format="string") as srv:
        assert "hello there" not in rendered(srv)
