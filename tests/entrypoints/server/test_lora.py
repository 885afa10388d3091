"""LoRA adapters over HTTP: --lora-modules (name=path and JSON) listed in /v1/models with their
parent, a request's model selecting one (tokens equal transformers + peft merged), the load and
unload routes with vLLM's bodies (VLLM_ALLOW_RUNTIME_LORA_UPDATING set), and bad adapters
answered with a 4xx naming the field while the server serves on and frees every KV block."""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest

from tests.entrypoints.server.conftest import start_server, stop_server
from tests.lora.helpers import make_adapter, merged_greedy, with_config
from tests.utils import make_checkpoint

PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def adapters():
    base = make_checkpoint("llama")
    return base, [make_adapter(base, 1), make_adapter(base, 2, rank=4), make_adapter(base, 3),
                  make_adapter(base, 10, rank=32)]


@pytest.fixture(scope="module")
def lora_server(adapters):
    base, paths = adapters
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    try:
        proc, srv = start_server(
            base, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--lora-modules",
            f"first={paths[0]}", json.dumps({"name": "second", "path": str(paths[1])}))
    finally:
        del os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
    yield srv
    stop_server(proc)


@pytest.fixture(scope="module")
def lora_client(lora_server):
    return openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="none", max_retries=0)


def _tokens(client, model: str) -> list[int]:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0,
                                    logprobs=0, extra_body={"ignore_eos": True})
    return out.choices[0].logprobs.tokens


def _want(base, path, tokenizer) -> list[str]:
    ids = merged_greedy(base, path, [PROMPT], 6)[0]
    return [tokenizer.decode([i]) for i in ids]


def test_models_lists_adapters_with_their_parent(lora_server, lora_client):
    cards = {card.id: card for card in lora_client.models.list().data}
    assert set(cards) == {lora_server.model, "first", "second"}
    assert cards["first"].parent == lora_server.model and cards["second"].parent is not None


def test_model_names_an_adapter(lora_server, lora_client, adapters):
    import transformers

    base, paths = adapters
    tok = transformers.AutoTokenizer.from_pretrained(base)
    assert _tokens(lora_client, "first") == _want(base, paths[0], tok)
    assert _tokens(lora_client, "second") == _want(base, paths[1], tok)
    assert _tokens(lora_client, lora_server.model) == _want(base, None, tok)
    with pytest.raises(openai.NotFoundError):
        _tokens(lora_client, "no-such-adapter")


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)


def test_load_and_unload_adapters(lora_server, lora_client, adapters):
    base, paths = adapters
    loaded = _post(lora_server, "load_lora_adapter", {"lora_name": "third",
                                                      "lora_path": str(paths[2])})
    assert loaded.status_code == 200, loaded.text
    assert "third" in {card.id for card in lora_client.models.list().data}
    assert len(_tokens(lora_client, "third")) == 6
    again = _post(lora_server, "load_lora_adapter", {"lora_name": "third",
                                                     "lora_path": str(paths[2])})
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    assert _post(lora_server, "unload_lora_adapter", {"lora_name": "third"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _tokens(lora_client, "third")
    assert _post(lora_server, "unload_lora_adapter", {"lora_name": "third"}).status_code == 404



def test_load_inplace_replaces_an_adapter(lora_server, lora_client, adapters):
    """vLLM's load_inplace: the name then serves the new adapter (without it: a 400)."""
    import transformers

    base, paths = adapters
    tok = transformers.AutoTokenizer.from_pretrained(base)
    body = {"lora_name": "swapped", "lora_path": str(paths[0])}
    assert _post(lora_server, "load_lora_adapter", body).status_code == 200
    assert _tokens(lora_client, "swapped") == _want(base, paths[0], tok)
    body["lora_path"] = str(paths[1])
    assert _post(lora_server, "load_lora_adapter", body).status_code == 400
    replaced = _post(lora_server, "load_lora_adapter", {**body, "load_inplace": True})
    assert replaced.status_code == 200, replaced.text
    assert _tokens(lora_client, "swapped") == _want(base, paths[1], tok)
    assert _post(lora_server, "unload_lora_adapter", {"lora_name": "swapped"}).status_code == 200

@pytest.mark.parametrize(("path", "param", "status"), [(3, "max_lora_rank", 400),
                                                     ("/nonexistent", "lora_path", 404)])
def test_bad_adapter_is_a_4xx_naming_the_field(lora_server, lora_client, adapters, path, param,
                                               status):
    """A path that does not exist is vLLM's 404 ("No adapter found"); one that does not load
    is a 400."""
    lora_path = str(adapters[1][path]) if isinstance(path, int) else path
    bad = _post(lora_server, "load_lora_adapter", {"lora_name": "bad", "lora_path": lora_path})
    assert bad.status_code == status and bad.json()["error"]["param"] == param, bad.text
    assert "bad" not in {card.id for card in lora_client.models.list().data}
    assert len(_tokens(lora_client, "first")) == 6  # serving on
    assert lora_server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0



def test_empty_adapter_name_is_a_400_naming_lora_name(lora_server, adapters):
    bad = _post(lora_server, "load_lora_adapter", {"lora_name": "",
                                                   "lora_path": str(adapters[1][2])})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_name", bad.text


def test_malformed_adapter_config_is_a_400_not_a_500(lora_server, lora_client, adapters):
    odd = with_config(adapters[1][0], target_modules=5)
    bad = _post(lora_server, "load_lora_adapter", {"lora_name": "odd", "lora_path": str(odd)})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "target_modules", bad.text
    assert len(_tokens(lora_client, "first")) == 6  # serving on

def test_replies_name_the_adapter_as_their_model(lora_server, lora_client):
    """vLLM answers with the adapter's name as `model` (the base model's name otherwise),
    streamed or not, on completions and chat."""
    messages = [{"role": "user", "content": "hi"}]
    done = lora_client.completions.create(model="first", prompt=PROMPT, max_tokens=2)
    chunks = list(lora_client.completions.create(model="first", prompt=PROMPT, max_tokens=2,
                                                 stream=True))
    chat = lora_client.chat.completions.create(model="second", messages=messages, max_tokens=2)
    chat_chunks = list(lora_client.chat.completions.create(model="second", messages=messages,
                                                           max_tokens=2, stream=True))
    assert done.model == "first" and {c.model for c in chunks} == {"first"}
    assert chat.model == "second" and {c.model for c in chat_chunks} == {"second"}
    base = lora_client.completions.create(model=lora_server.model, prompt=PROMPT, max_tokens=2)
    assert base.model == lora_server.model
    assert lora_server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0
