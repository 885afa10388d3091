"""`compiled-llm bench serve` against the live `compiled-llm serve` of the tiny test model (the
shared server fixture, which wants an API key) from two client processes: vLLM's report lines
and JSON keys, figures that agree with each other and with the workload, ShareGPT and custom
files with gamma arrivals and goodput; the request split and the random and nano-vllm workloads
on their own."""

from __future__ import annotations

import json
import time

import pytest

from compiled_llm.entrypoints.cli.bench import (
    ThroughputArgs,
    nano_vllm_requests,
    nano_vllm_workload,
)
from compiled_llm.entrypoints.cli.bench_datasets import random_requests
from compiled_llm.entrypoints.cli.bench_serve import ServeBenchArgs
from compiled_llm.entrypoints.cli.main import main
from compiled_llm.entrypoints.cli.serve_client import split
from tests.entrypoints.server.conftest import API_KEY

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 6, 12, 5
REPORT_LINES = [
    "Successful requests:", "Benchmark duration (s):", "Total input tokens:",
    "Total generated tokens:", "Request throughput (req/s):",
    "Output token throughput (tok/s):", "Total token throughput (tok/s):",
    *(f"{stat} {name} (ms):" for name in ("TTFT", "TPOT", "ITL")
      for stat in ("Mean", "Median", "P99"))]
JSON_KEYS = ["duration", "completed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "output_throughput", "total_token_throughput",
             *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el")
               for stat in ("mean", "median", "std", "p99")),
             "input_lens", "output_lens", "ttfts", "itls", "errors", "starts"]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)  # bench serve's client sends it, as vLLM's


def _bench(server, tmp_path, *extra: str) -> dict:
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", server.url, "--num-prompts", str(NUM_PROMPTS),
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
            "--ignore-eos", "--max-concurrency", "4", "--num-client-processes", "2",
            "--result-filename", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_bench_serve_reports_consistent_figures(server, tmp_path, capsys):
    result = _bench(server, tmp_path, "--temperature", "0.6")
    printed = capsys.readouterr().out
    assert [line for line in REPORT_LINES if line not in printed] == []
    assert [key for key in JSON_KEYS if key not in result] == []
    assert result["model_id"] == server.model and result["num_client_processes"] == 2
    assert result["completed"] == NUM_PROMPTS and result["failed"] == 0
    assert result["errors"] == [""] * NUM_PROMPTS
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert result["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    for ttft, e2el, itl in zip(result["ttfts"], result["e2els"], result["itls"]):
        assert 0 < ttft <= e2el
        # one gap per event after the first: one event a token unless the client reads
        # slower than the server writes (a loaded machine), when one event carries several
        assert 0 <= len(itl) <= OUTPUT_LEN - 1
        assert ttft + sum(itl) <= e2el
    duration = result["duration"]
    assert result["output_throughput"] == pytest.approx(NUM_PROMPTS * OUTPUT_LEN / duration)
    assert result["request_throughput"] == pytest.approx(NUM_PROMPTS / duration)
    assert max(result["e2els"]) <= duration
    # send times on one clock over both client processes: within the run, and on this
    # machine's monotonic clock (what the server's gc log stamps)
    starts = result["starts"]
    assert max(starts) - min(starts) <= duration <= time.monotonic() - min(starts)
    assert result["median_ttft_ms"] <= result["p99_ttft_ms"]
    assert result["mean_ttft_ms"] <= result["mean_e2el_ms"]


def test_bench_serve_chat_endpoint(server, tmp_path, capsys):
    """Chat gets the prompts as text (vLLM's --backend openai-chat picks its endpoint): the
    input tokens are the server's count after its template, the outputs exactly as asked;
    --percentile-metrics / --metric-percentiles pick the report's rows and p<q> keys."""
    result = _bench(server, tmp_path, "--backend", "openai-chat", "--request-rate", "50",
                    "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90")
    assert result["endpoint"] == "/v1/chat/completions" and result["backend"] == "openai-chat"
    printed = capsys.readouterr().out
    assert "P90 E2EL (ms):" in printed and "P50 TTFT (ms):" in printed
    assert "ITL (ms)" not in printed
    assert result["p50_ttft_ms"] <= result["p90_ttft_ms"]
    assert result["p50_e2el_ms"] <= result["p90_e2el_ms"]
    assert result["completed"] == NUM_PROMPTS
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert all(0 <= len(itl) <= OUTPUT_LEN - 1 for itl in result["itls"])
    assert all(n > 0 for n in result["input_lens"])


def test_bench_serve_sharegpt_file(server, tmp_path, capsys):
    """vLLM's ShareGPT file: the first turns sent as text, each asking for its reply's token
    count (--ignore-eos: exactly that many come back); too-short and one-turn conversations
    left out; bursty arrivals at a rate; goodput under a loose SLO is the request throughput."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server.model)
    texts = [("The quick brown fox jumps over the lazy dog.", "Permission is hereby granted."),
             ("Permission is hereby granted, free of charge,", "THE SOFTWARE IS PROVIDED AS IS"),
             ("to any person obtaining a copy of this software.", "The lazy dog sleeps on."),
             ("WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED.", "quick brown fox jumps")]
    convs = [[{"from": "human", "value": q}, {"from": "gpt", "value": a}] for q, a in texts]
    convs += [[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": texts[0][1]}],
              [{"from": "human", "value": texts[0][0]}]]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": c} for c in convs]))
    out = tmp_path / "sharegpt-result.json"
    assert main(["bench", "serve", "--base-url", server.url, "--dataset-name", "sharegpt",
                 "--dataset-path", str(path), "--num-prompts", "4", "--no-oversample",
                 "--ignore-eos", "--request-rate", "100", "--burstiness", "0.5",
                 "--goodput", "e2el:600000", "ttft:600000",
                 "--result-filename", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Burstiness factor: 0.5 (Gamma distribution)" in printed
    assert "Request goodput (req/s):" in printed
    result = json.loads(out.read_text())
    assert result["completed"] == 4 and result["failed"] == 0
    counts = [(len(tok(q).input_ids), len(tok(a).input_ids)) for q, a in texts]
    assert min(c for pair in counts for c in pair) >= 4  # all four pass the filters
    assert sorted(zip(result["input_lens"], result["output_lens"])) == sorted(counts)
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert result["dataset_name"] == "sharegpt" and result["burstiness"] == 0.5


def test_bench_serve_custom_file_on_the_chat_endpoint(server, tmp_path):
    """Custom JSON lines: the chat endpoint gets each prompt bare (the server templates it),
    --custom-output-len tokens each, oversampled to --num-prompts."""
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "The quick brown fox"}\n{"prompt": "jumps over the dog"}\n')
    out = tmp_path / "custom-result.json"
    assert main(["bench", "serve", "--base-url", server.url, "--backend", "openai-chat",
                 "--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", "3",
                 "--custom-output-len", "3", "--ignore-eos", "--result-filename",
                 str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 3 and result["output_lens"] == [3, 3, 3]
    assert result["request_goodput"] is None and all(n > 4 for n in result["input_lens"])


def test_a_failed_test_request_stops_the_run(server, capsys):
    assert main(["bench", "serve", "--base-url", server.url, "--model", "no-such-model",
                 "--tokenizer", server.model, "--num-prompts", "2"]) == 2
    assert "the test request failed" in capsys.readouterr().err


def test_split_deals_requests_concurrency_and_rate():
    bodies = [{"i": i} for i in range(7)]
    shares = split(bodies, 3, 8, 6.0, 10, url="u")
    assert [[b["i"] for b in s.bodies] for s in shares] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [s.concurrency for s in shares] == [3, 3, 2]
    assert [s.rate for s in shares] == [2.0, 2.0, 2.0]
    assert len({s.seed for s in shares}) == 3
    # never more processes than requests may be in flight
    assert [s.concurrency for s in split(bodies, 4, 2, float("inf"), 0, url="u")] == [1, 1]
    assert [s.concurrency for s in split(bodies, 2, None, float("inf"), 0, url="u")] == [
        None, None]


def test_random_requests_lengths():
    data = random_requests(200, 100, 10, 0.5, 50, seed=1)
    assert all(50 <= len(ids) <= 150 and 5 <= n <= 15 for ids, n in data)
    assert all(1 <= i < 50 for ids, _ in data for i in ids)
    assert random_requests(3, 4, 2, 0.0, 50, seed=1) == random_requests(3, 4, 2, 0.0, 50, 1)


def test_nano_vllm_workload():
    reqs = nano_vllm_requests(1000)
    assert len(reqs) == 256
    assert all(100 <= len(ids) <= 1024 and 100 <= n <= 1024 for ids, n in reqs)
    assert nano_vllm_requests(1000) == reqs != nano_vllm_requests(1000, seed=1)

    class FakeLLM:  # all the workload reads of an LLM
        def get_tokenizer(self):
            return type("Tokenizer", (), {"vocab_size": 1000})()

    prompts, params = nano_vllm_workload(FakeLLM())
    assert [p["prompt_token_ids"] for p in prompts] == [ids for ids, _ in reqs]
    assert [p.max_tokens for p in params] == [n for _, n in reqs]
    assert {(p.temperature, p.ignore_eos) for p in params} == {(0.6, True)}
    with pytest.raises(ValueError, match="dataset_name"):
        ThroughputArgs(dataset_name="sonnet")


@pytest.mark.parametrize("bad", [{"num_prompts": 0}, {"random_range_ratio": 1.0},
                                 {"request_rate": 0.0}, {"max_concurrency": 0},
                                 {"num_client_processes": 0}, {"endpoint": "/v1/embeddings"},
                                 {"backend": "tgi"}, {"percentile_metrics": "ttft,goodput"},
                                 {"metric_percentiles": "99,101"},
                                 {"metric_percentiles": "p99"}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ServeBenchArgs(**bad)


def test_event_lines_split_at_line_feeds_only():
    """JSON strings may hold U+2028 or U+0085 raw: they are not line ends in an event stream."""
    import asyncio

    import httpx

    from compiled_llm.entrypoints.cli.serve_client import sse_lines

    body = 'data: {"t": "a\u2028b\x85c\x1cd"}\r\n\r\ndata: [DONE]\n\n'.encode()

    async def lines():
        return [line async for line in sse_lines(httpx.Response(200, content=body))]

    assert asyncio.run(lines()) == ['data: {"t": "a\u2028b\x85c\x1cd"}', "", "data: [DONE]", ""]
