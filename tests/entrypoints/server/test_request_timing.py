"""The server's request metrics as vLLM keeps them: a request answered in one body is timed by
its steps (time to first token is the first step's, every later step an inter-token gap); n = 2
counts as two finished requests; vLLM's per-request histograms; token counters that move while
a request runs."""

from __future__ import annotations

import httpx

from tests.entrypoints.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TTFT = "compiled_llm:time_to_first_token_seconds"
ITL = "compiled_llm:inter_token_latency_seconds"
E2E = "compiled_llm:e2e_request_latency_seconds"
LENGTH = "compiled_llm:request_success_total[length]"


def _delta(after: dict, before: dict, key: str) -> float:
    return after[key] - before.get(key, 0.0)


def _complete(server, **body) -> dict:
    body = {"model": server.model, "prompt": "The quick brown", "max_tokens": 16,
            "temperature": 0.0, "ignore_eos": True, **body}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_non_streamed_request_is_timed_by_its_steps(server):
    before = server.wait_idle()
    _complete(server)
    after = server.wait_idle()
    assert _delta(after, before, f"{TTFT}_count") == 1
    assert _delta(after, before, f"{ITL}_count") == 15
    ttft, e2e = _delta(after, before, f"{TTFT}_sum"), _delta(after, before, f"{E2E}_sum")
    assert 0 < ttft < e2e
    assert _delta(after, before, LENGTH) == 1


def test_n_sequences_count_as_requests(server):
    before = server.wait_idle()
    body = _complete(server, n=2, temperature=1.0, seed=1, max_tokens=4)
    assert len(body["choices"]) == 2
    after = server.wait_idle()
    assert _delta(after, before, LENGTH) == 2
    assert _delta(after, before, "compiled_llm:generation_tokens_total") == 8



def test_vllm_request_histograms(server):
    before = server.wait_idle()
    _complete(server, n=2, temperature=1.0, seed=2, max_tokens=6)
    after = server.wait_idle()
    for name, total in (("request_params_n", 2), ("request_params_max_tokens", 6),
                        ("request_max_num_generation_tokens", 6)):
        assert _delta(after, before, f"vllm:{name}_count") == 1
        assert _delta(after, before, f"vllm:{name}_sum") == total
    for phase in ("queue", "prefill", "decode", "inference"):
        assert _delta(after, before, f"vllm:request_{phase}_time_seconds_count") == 1
    assert _delta(after, before, "vllm:request_time_per_output_token_seconds_sum") > 0


def test_token_counters_move_while_a_stream_runs(server):
    before = server.wait_idle()
    body = {"model": server.model, "prompt": "The quick brown", "max_tokens": 400,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH,
                      timeout=120) as reply:
        events = (line for line in reply.iter_lines() if line.startswith("data: {"))
        for _ in range(20):
            next(events)
        running = server.metrics()
        gen = _delta(running, before, "compiled_llm:generation_tokens_total")
        # counted as they come: fewer than all unless the server ran ahead of this client
        assert 20 <= gen < 400 or _delta(running, before, LENGTH) == 1
        assert _delta(running, before, "compiled_llm:prompt_tokens_total") > 0
        for _ in events:
            pass
    after = server.wait_idle()
    assert _delta(after, before, "compiled_llm:generation_tokens_total") == 400
