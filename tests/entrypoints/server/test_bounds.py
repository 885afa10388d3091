"""Bounded work and honest health against an in-process server: a chat template past its time
limit is interrupted (a 400) while /health answers, a prompt list is capped and aborted when
its client leaves, /health reports a stuck engine, and SIGTERM stops a server whose engine is
stuck."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.entrypoints.server.inprocess import engine_args, serving

LOOP = "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}"


def test_row5_a_trusted_template_past_its_time_limit_is_a_400_and_health_answers():
    with serving(trust_request_chat_template=True, chat_template_timeout_s=0.5) as srv:
        result = {}

        def hostile():
            result["r"] = srv.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "chat_template_kwargs": {"chat_template": LOOP}})

        thread = threading.Thread(target=hostile)
        thread.start()
        health = []
        while thread.is_alive():  # the render runs off the event loop: /health answers
            health.append(httpx.get(f"{srv.url}/health", timeout=30).status_code)
        thread.join()
        r = result["r"]
        assert r.status_code == 400, r.text
        assert "ran past 0.5 s" in r.json()["error"]["message"]
        assert health and set(health) == {200}
        ok = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                               "max_tokens": 2})
        assert ok.status_code == 200, ok.text


def test_row11_a_prompt_list_is_capped_and_aborted_when_the_client_leaves():
    with serving(max_completion_prompts=300) as srv:
        r = srv.post("/v1/completions", {"prompt": ["a"] * 301, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        body = {"prompt": [f"prompt {i}" for i in range(300)], "max_tokens": 400,
                "ignore_eos": True}
        with pytest.raises(httpx.TimeoutException):
            srv.post("/v1/completions", body, timeout=1.0)
        assert srv.idle(timeout=60), "the prompts of a client that left kept running"
        m = srv.engine.observer
        generated = m.gen_tokens._value.get()
        aborted = m.requests.labels(outcome="abort", model_name="test-model")._value.get()
        assert generated < 300 * 400 and aborted >= 1


def test_row13_health_is_503_while_the_engine_is_stuck():
    with serving(engine_iteration_timeout_s=0.3) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        time.sleep(0.5)  # idle past the threshold is not a stall
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.post(f"{srv.url}/ping").status_code == 200
        release = srv.block_engine()
        try:
            deadline = time.monotonic() + 30
            while (r := httpx.get(f"{srv.url}/health")).status_code == 200:
                assert time.monotonic() < deadline, "/health never reported the stall"
                time.sleep(0.05)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled"
        finally:
            release.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{srv.url}/health").status_code != 200:
            assert time.monotonic() < deadline, "/health did not recover"
            time.sleep(0.05)


def test_row13_sigterm_stops_a_server_whose_engine_is_stuck():
    with serving(engine_args(), timeout_graceful_shutdown=1.0) as srv:
        release = srv.block_engine()
        stuck = threading.Thread(target=lambda: srv.post(
            "/v1/completions", {"prompt": "hi", "max_tokens": 4}, timeout=120))
        stuck.start()  # a request in flight that the stuck engine never answers
        time.sleep(0.3)
        srv.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler runs
        srv.thread.join(timeout=60)
        exited = not srv.thread.is_alive()
        release.set()
        stuck.join(timeout=60)
        assert exited, "the server kept waiting for a request its stuck engine holds"
