"""Auth and headers against the live server: every route under /v1 needs the key (vLLM's
rule: /tokenize, /health and the rest are open), which must match exactly (under a root path too);
a header that is not UTF-8 is a 400 on any route; CORS follows the allowed_* settings."""

from __future__ import annotations

import httpx
import pytest

from tests.entrypoints.server.conftest import API_KEY
from tests.entrypoints.server.inprocess import serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}
GUARDED = [("GET", "/v1/models", None),
           ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
           ("POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
           ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 1})]
OPEN = [("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/ping", None),
        ("POST", "/ping", None), ("GET", "/openapi.json", None), ("GET", "/docs", None),
        ("GET", "/redoc", None), ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [1]})]


@pytest.mark.parametrize("method,path,body", GUARDED, ids=[p for _, p, _ in GUARDED])
def test_row17_every_guarded_route_needs_the_key(server, method, path, body):
    r = httpx.request(method, f"{server.url}{path}", json=body, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = httpx.request(method, f"{server.url}{path}", json=body, headers=AUTH, timeout=30)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("method,path,body", OPEN, ids=[f"{m} {p}" for m, p, _ in OPEN])
def test_row17_routes_outside_v1_are_open(server, method, path, body):
    """vLLM's AuthenticationMiddleware checks only {root_path}/v1 paths."""
    r = httpx.request(method, f"{server.url}{path}", json=body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", [f"Bearer {API_KEY}x", f"Bearer {API_KEY[:-1]}",
                                   f"bearer {API_KEY}", f"Bearer  {API_KEY}", API_KEY,
                                   f"Bearer {API_KEY}é"],
                         ids=["longer", "prefix", "lowercase_scheme", "two_spaces", "bare",
                              "non_ascii"])
def test_row17_only_the_exact_key_passes(server, value):
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": value.encode()})
    assert r.status_code == 401


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics", "/tokenize"])
def test_row9_a_header_that_is_not_utf8_is_a_400(server, path):
    r = httpx.get(f"{server.url}{path}", headers=[(b"x-note", b"caf\xe9"), *AUTH.items()])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_header"


def test_item5_cors_follows_the_allowed_settings():
    with serving(api_key="k", allowed_origins=["https://ok.example"],
                 allowed_methods=["POST"]) as srv:
        preflight = {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"}
        ok = httpx.options(f"{srv.url}/v1/completions",
                           headers={"Origin": "https://ok.example", **preflight})
        assert ok.status_code == 200  # answered without the key: a preflight carries none
        assert ok.headers["access-control-allow-origin"] == "https://ok.example"
        other = httpx.options(f"{srv.url}/v1/completions",
                              headers={"Origin": "https://evil.example", **preflight})
        assert "access-control-allow-origin" not in other.headers
        get = httpx.options(f"{srv.url}/v1/completions", headers={
            "Origin": "https://ok.example", "Access-Control-Request-Method": "DELETE"})
        assert get.status_code == 400  # a method outside allowed_methods
        r = httpx.get(f"{srv.url}/v1/models", headers={"Origin": "https://ok.example",
                                                       "Authorization": "Bearer k"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://ok.example"


def test_item5_any_of_several_keys_passes():
    with serving(api_key=["first", "second"]) as srv:
        for key in ("first", "second"):
            r = httpx.get(f"{srv.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        for value in ("Bearer third", "Bearer firstsecond", ""):
            r = httpx.get(f"{srv.url}/v1/models", headers={"Authorization": value})
            assert r.status_code == 401


def test_item5_open_paths_stay_open_under_a_root_path():
    """uvicorn puts --root-path in front of every path: /health is still /health."""
    with serving(api_key="k", root_path="/api") as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.post(f"{srv.url}/tokenize", json={"prompt": "hi"}).status_code == 200
        assert httpx.get(f"{srv.url}/v1/models").status_code == 401
        ok = httpx.get(f"{srv.url}/v1/models", headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
