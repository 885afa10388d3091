"""The pooling app in process (fastapi's TestClient over a real AsyncPoolingLLM): /classify on
a tiny BERT classifier, /metrics, vLLM's embed_dtype and endianness on base64 vectors, id and
created on /v1/embeddings, and 400s naming the vLLM fields this server does not honour."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM
from compiled_llm.entrypoints.server.pooling_app import build_pooling_app
from compiled_llm.entrypoints.server.server_config import ServerConfig
from tests.entrypoints.pooling.checkpoints import bert_classifier, minilm_dir
from tests.utils import make_checkpoint

TEXTS = ["a short one", "A somewhat longer sentence to classify, with punctuation!"]


def _client(model_dir):
    from fastapi.testclient import TestClient

    engine = AsyncPoolingLLM(EngineArgs(model=str(model_dir), runner="pooling",
                                        enforce_eager=True, dtype="float32"))
    cfg = ServerConfig(model_name="m", extra_model_names=["alias"])
    return engine, TestClient(build_pooling_app(engine, cfg))


@pytest.fixture(scope="module")
def embedder():
    engine, client = _client(minilm_dir())
    yield client
    engine.shutdown()


@pytest.fixture(scope="module")
def classifier():
    engine, client = _client(bert_classifier(3))
    yield client
    engine.shutdown()


def _refused(client, path: str, body: dict, param: str) -> dict:
    resp = client.post(path, json={"model": "m", **body})
    assert resp.status_code == 400, (body, resp.text)
    error = resp.json()["error"]
    assert error["param"] == param and param in error["message"], (body, error)
    return error


def test_classify_answers_vllms_shape(classifier):
    import transformers

    body = classifier.post("/classify", json={"model": "m", "input": TEXTS}).json()
    assert body["object"] == "list" and body["id"].startswith("classify-")
    assert isinstance(body["created"], int) and body["model"] == "m"
    tok = transformers.AutoTokenizer.from_pretrained(bert_classifier(3))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(bert_classifier(3))
    for i, (text, item) in enumerate(zip(TEXTS, body["data"])):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).logits[0].softmax(-1)
        torch.testing.assert_close(torch.tensor(item["probs"]), ref, atol=1e-5, rtol=1e-5)
        assert item["index"] == i and item["num_classes"] == 3
        assert item["label"] == hf.config.id2label[int(ref.argmax())]
    tokens = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens,
                             "completion_tokens": 0, "prompt_tokens_details": None}  # vLLM's
    one = classifier.post("/classify", json={"input": TEXTS[0], "use_activation": False}).json()
    assert abs(sum(one["data"][0]["probs"]) - 1) > 1e-3  # logits, as vLLM's use_activation


def test_classify_refusals(classifier, embedder):
    error = _refused(embedder, "/classify", {"input": "hi"}, "runner")
    assert "classification head" in error["message"]
    _refused(classifier, "/classify", {}, "input")
    _refused(classifier, "/classify", {"input": "hi", "priority": 1}, "priority")
    _refused(classifier, "/pooling", {"input": "hi", "normalize": True}, "normalize")
    _refused(classifier, "/pooling", {"input": "hi", "task": "embed"}, "task")
    ok = classifier.post("/pooling", json={"input": "hi", "task": "classify"})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["data"]) == 3


def test_embeddings_id_created_and_embed_dtypes(embedder):
    floats = embedder.post("/v1/embeddings", json={"input": TEXTS[0]}).json()
    assert floats["id"].startswith("embd-") and isinstance(floats["created"], int)
    vector = np.asarray(floats["data"][0]["embedding"], dtype=np.float32)
    named = embedder.post("/v1/embeddings", json={"input": "x", "request_id": "abc"}).json()
    assert named["id"] == "embd-abc"

    def decoded(**fields) -> bytes:
        body = {"input": TEXTS[0], "encoding_format": "base64", **fields}
        resp = embedder.post("/v1/embeddings", json=body)
        assert resp.status_code == 200, resp.text
        return base64.b64decode(resp.json()["data"][0]["embedding"])

    assert decoded() == vector.astype("<f4").tobytes()
    assert decoded(embed_dtype="float16") == vector.astype("<f2").tobytes()
    assert decoded(embed_dtype="float32", endianness="big") == vector.astype(">f4").tobytes()
    bf16 = torch.tensor(vector).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert decoded(embed_dtype="bfloat16", endianness="little") == bf16


def test_unhonoured_fields_are_refused_by_name(embedder):
    _refused(embedder, "/v1/embeddings", {"input": "hi", "embed_dtype": "fp8_e4m3",
                                          "encoding_format": "base64"}, "embed_dtype")
    _refused(embedder, "/v1/embeddings", {"input": "hi", "embed_dtype": "int8"}, "embed_dtype")
    _refused(embedder, "/pooling", {"messages": [{"role": "user", "content": "hi"}]},
             "messages")
    _refused(embedder, "/v1/embeddings", {"input": "hi", "add_special_tokens": False},
             "add_special_tokens")
    _refused(embedder, "/v1/embeddings", {"input": "hi", "truncation_side": "right"},
             "truncation_side")
    _refused(embedder, "/pooling", {"input": "hi", "task": "token_embed"}, "task")
    _refused(embedder, "/pooling", {"input": "hi", "use_activation": False}, "use_activation")
    _refused(embedder, "/v1/score", {"text_1": "a", "text_2": "b", "softmax": True}, "softmax")
    _refused(embedder, "/v1/rerank", {"query": "a", "documents": ["b"], "cache_salt": "s"},
             "cache_salt")
    # neutral values of those fields, and fields no API defines, are accepted as vLLM does
    for body in ({"input": "hi", "priority": 0, "add_special_tokens": True, "bogus_field": 1},
                 {"input": "hi", "task": "embed", "normalize": False}):
        assert embedder.post("/pooling", json=body).status_code == 200, body


def _sample(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_metrics_count_pooling_requests(embedder):
    before = embedder.get("/metrics")
    assert before.status_code == 200
    ok = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"}'
    count = 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"}'
    start_ok, start_e2e = _sample(before.text, ok), _sample(before.text, count)
    start_tokens = _sample(before.text, 'vllm:prompt_tokens_total{engine="0",model_name="m"}')
    body = embedder.post("/v1/embeddings", json={"input": TEXTS}).json()
    embedder.post("/v1/embeddings", json={"input": "hi", "priority": 3})  # a 400
    after = embedder.get("/metrics").text
    assert _sample(after, ok) == start_ok + 2 and _sample(after, count) == start_e2e + 2
    assert _sample(after, 'vllm:prompt_tokens_total{engine="0",model_name="m"}') == \
        start_tokens + body["usage"]["prompt_tokens"]
    rejected = 'compiled_llm:request_success_total{model_name="m",outcome="rejected"}'
    assert _sample(after, rejected) >= 1


def test_score_takes_vllms_other_field_names(embedder):
    docs = ["a fox", "tax law", "canids"]
    want = embedder.post("/v1/score", json={"text_1": "fox", "text_2": docs}).json()
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        got = embedder.post("/score", json={"model": "m", first: "fox", second: docs})
        assert got.status_code == 200, (first, got.text)
        assert got.json()["data"] == want["data"] and got.json()["usage"] == want["usage"]


def test_rerank_top_n_zero_is_every_document_and_usage_has_prompt_tokens(embedder):
    docs = ["a fox", "tax law", "canids"]
    body = embedder.post("/v1/rerank", json={"query": "fox", "documents": docs, "top_n": 0})
    assert body.status_code == 200, body.text
    results, usage = body.json()["results"], body.json()["usage"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0  # vLLM's RerankUsage
    _refused(embedder, "/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n")


def test_served_model_names_are_all_accepted_and_listed(embedder):
    assert [card["id"] for card in embedder.get("/v1/models").json()["data"]] == ["m", "alias"]
    ok = embedder.post("/v1/embeddings", json={"model": "alias", "input": "hi"})
    assert ok.status_code == 200 and ok.json()["model"] == "m"  # vLLM answers the first name
    assert embedder.post("/v1/embeddings", json={"model": "x", "input": "hi"}).status_code == 404


def test_tokenize_and_detokenize_as_the_generate_server(embedder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    text = "The quick brown fox"
    body = embedder.post("/tokenize", json={"model": "alias", "prompt": text,
                                            "return_token_strs": True})
    assert body.status_code == 200, body.text
    got = body.json()
    assert got["tokens"] == tok.encode(text) and got["count"] == len(got["tokens"])
    assert got["token_strs"] == tok.convert_ids_to_tokens(got["tokens"])
    assert got["max_model_len"] == embedder.get("/v1/models").json()["data"][0]["max_model_len"]
    bare = embedder.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == tok.encode(text, add_special_tokens=False)
    back = embedder.post("/detokenize", json={"model": "m", "tokens": bare["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": tok.decode(bare["tokens"])}


def test_tokenize_and_detokenize_refusals(embedder):
    _refused(embedder, "/tokenize", {}, "prompt")  # neither prompt nor messages
    _refused(embedder, "/tokenize", {"prompt": "x", "messages": []}, "prompt")
    _refused(embedder, "/tokenize", {"prompt": "fox " * 100_000}, "prompt")  # max_prompt_bytes
    lone = embedder.post("/tokenize", content=b'{"prompt": "\\ud800"}',  # JSON's escape
                         headers={"content-type": "application/json"})
    assert lone.status_code == 400 and lone.json()["error"]["param"] == "prompt", lone.text
    _refused(embedder, "/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                     "chat_template": "{{ messages }}"}, "chat_template")
    _refused(embedder, "/detokenize", {"tokens": [-1]}, "tokens")
    _refused(embedder, "/detokenize", {"tokens": [10 ** 9]}, "tokens")
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [101]})):
        missing = embedder.post(path, json={"model": "x", **body})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert embedder.post("/tokenize", json={"prompt": "still up"}).status_code == 200


def test_token_routes_without_a_tokenizer_are_400s():
    from fastapi.testclient import TestClient

    engine = AsyncPoolingLLM(EngineArgs(model=str(minilm_dir()), runner="pooling",
                                        enforce_eager=True, dtype="float32",
                                        skip_tokenizer_init=True))
    try:
        client = TestClient(build_pooling_app(engine, ServerConfig(model_name="m")))
        _refused(client, "/detokenize", {"tokens": [101]}, "tokens")
        _refused(client, "/tokenize", {"prompt": "hi"}, "prompt")
    finally:
        engine.shutdown()


def test_chat_style_embeddings_embed_the_rendered_chat():
    """vLLM's chat form of /v1/embeddings: messages rendered by the chat template (no
    generation prompt) and embedded as the ids /tokenize gives for them."""
    engine, client = _client(make_checkpoint("qwen3"))  # its tokenizer has a chat template
    try:
        messages = [{"role": "user", "content": "hi there"}]
        ids = client.post("/tokenize", json={"model": "m", "messages": messages,
                                             "add_generation_prompt": False}).json()["tokens"]
        by_chat = client.post("/v1/embeddings", json={"model": "m", "messages": messages})
        assert by_chat.status_code == 200, by_chat.text
        by_ids = client.post("/v1/embeddings", json={"model": "m", "input": ids}).json()
        assert by_chat.json()["data"][0]["embedding"] == by_ids["data"][0]["embedding"]
        assert by_chat.json()["usage"]["prompt_tokens"] == len(ids)
        _refused(client, "/v1/embeddings", {"messages": messages, "input": "x"}, "messages")
        _refused(client, "/v1/embeddings", {"messages": messages, "add_special_tokens": True},
                 "add_special_tokens")
        bad = client.post("/v1/embeddings", json={"model": "m", "messages": [{"role": 3}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("messages")
    finally:
        engine.shutdown()
