"""A live `compiled-llm serve --runner pooling` on all-MiniLM-L6-v2: /v1/embeddings through the
official openai client (floats and base64) against sentence-transformers, /v1/score,
/v1/rerank, /pooling, /tokenize and /detokenize through httpx, 4xx naming the field (the server
serving on), and the 400s naming the runner: generation routes here, pooling routes on the
generate server."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.entrypoints.pooling.checkpoints import minilm_dir
from tests.entrypoints.server.conftest import API_KEY, start_server, stop_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world"]


@pytest.fixture(scope="module")
def pooled():
    proc, srv = start_server(minilm_dir(), "--runner", "pooling", "--api-key", API_KEY,
                             "--served-model-name", "minilm")
    yield srv
    stop_server(proc)


@pytest.fixture(scope="module")
def oai(pooled):
    import openai

    return openai.OpenAI(base_url=f"{pooled.url}/v1", api_key=API_KEY, max_retries=0)


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json={"model": "minilm", **body}, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"})


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS)


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_embeddings_float_and_base64(oai, reference):
    floats = oai.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 384
    assert (_cosines([d.embedding for d in floats.data], reference) >= 0.999).all()
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    b64 = oai.embeddings.create(model="minilm", input=TEXTS, encoding_format="base64")
    assert isinstance(b64.data[0].embedding, str)
    import base64

    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data]
    np.testing.assert_allclose(decoded, [d.embedding for d in floats.data], atol=1e-6)
    default = oai.embeddings.create(model="minilm", input=TEXTS[0])  # the client asks base64
    np.testing.assert_allclose(default.data[0].embedding, floats.data[0].embedding, atol=1e-6)


def test_token_id_inputs_and_bad_input(oai, pooled):
    import openai

    ids = oai.embeddings.create(model="minilm", input=[[101, 7592, 2088, 102]],
                                encoding_format="float")
    assert len(ids.data) == 1 and len(ids.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model="minilm", input="hi", dimensions=64)
    assert err.value.body["param"] == "dimensions"
    for body, param in (({"input": []}, "input"), ({"input": 5}, "input"),
                        ({"input": "hi", "encoding_format": "hex"}, "encoding_format"),
                        ({"input": "word " * 400}, "input"),
                        ({"input": [[10**9]]}, "input"),
                        ({"input": "hi", "truncate_prompt_tokens": 0},
                         "truncate_prompt_tokens")):
        resp = _post(pooled, "/v1/embeddings", body)
        assert resp.status_code == 400, (body, resp.text)
        assert resp.json()["error"]["param"].split(".")[0] == param, resp.text
    assert _post(pooled, "/v1/embeddings", {"input": "x", "model": "other"}).status_code == 404
    assert len(oai.embeddings.create(model="minilm", input="still up").data) == 1


def test_score_rerank_and_pooling(pooled):
    query, docs = "A cat sits on the mat.", ["Stock prices fell.", "A cat is on a mat."]
    score = _post(pooled, "/v1/score", {"text_1": query, "text_2": docs}).json()
    assert [d["index"] for d in score["data"]] == [0, 1] and score["object"] == "list"
    s0, s1 = (d["score"] for d in score["data"])
    assert s1 > s0 and score["usage"]["total_tokens"] > 0
    rerank = _post(pooled, "/v1/rerank", {"query": query, "documents": docs, "top_n": 1}).json()
    assert len(rerank["results"]) == 1 and rerank["results"][0]["index"] == 1
    assert rerank["results"][0]["relevance_score"] == pytest.approx(s1, abs=1e-6)
    assert rerank["results"][0]["document"] == {"text": docs[1]}
    pooled_out = _post(pooled, "/pooling", {"input": TEXTS}).json()
    assert len(pooled_out["data"]) == 2 and len(pooled_out["data"][0]["data"]) == 384
    bad = _post(pooled, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"
    bad = _post(pooled, "/v1/rerank", {"query": query, "documents": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"


def test_pooling_server_refuses_generation(oai, pooled):
    import openai

    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = _post(pooled, path, {"prompt": "hi", "messages": []})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "runner"
        assert "runner='pooling'" in resp.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="runner"):
        oai.completions.create(model="minilm", prompt="hi")
    models = oai.models.list()
    assert models.data[0].id == "minilm"


def test_pooling_server_tokenizes_and_detokenizes(pooled):
    tok = _post(pooled, "/tokenize", {"prompt": TEXTS[1]})
    assert tok.status_code == 200, tok.text
    ids = tok.json()["tokens"]
    assert ids[0] == 101 and ids[-1] == 102 and tok.json()["count"] == len(ids)  # [CLS] [SEP]
    back = _post(pooled, "/detokenize", {"tokens": ids[1:-1]})
    assert back.status_code == 200 and back.json()["prompt"] == TEXTS[1].lower()
    assert _post(pooled, "/detokenize", {"tokens": [-1]}).json()["error"]["param"] == "tokens"
    assert _post(pooled, "/tokenize", {"prompt": "x", "model": "other"}).status_code == 404
    # the key guards /v1 alone, as vLLM's: /tokenize is open, /v1/embeddings is not
    keyless = httpx.post(f"{pooled.url}/tokenize", json={"prompt": "x"}, timeout=60)
    assert keyless.status_code == 200, keyless.text
    keyless = httpx.post(f"{pooled.url}/v1/embeddings", json={"input": "x"}, timeout=60)
    assert keyless.status_code == 401


def test_generate_server_refuses_pooling_routes(server):
    for path in ("/v1/embeddings", "/v1/score", "/v1/rerank", "/pooling"):
        resp = httpx.post(f"{server.url}{path}", json={"input": "hi"}, timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "runner"
        assert "runner='generate'" in resp.json()["error"]["message"]
