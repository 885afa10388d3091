"""vLLM's `chat`, `complete` and `run-batch` subcommands end to end on the CPU: the clients
against one live server of the tiny model (greedy through its generation config, so the
streamed replies can be checked against the server's own), run-batch on a JSONL of good and
bad lines in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiled_llm.entrypoints.cli.args import engine_args as engine_args_of
from compiled_llm.entrypoints.cli.main import build_parser
from tests.entrypoints.server.inprocess import MODEL, engine_args, serving

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-cli-test"
GREEDY = {"top_k": 1, "max_new_tokens": 8}  # every reply greedy and short
FAST = ["--device", "cpu", "--enforce-eager", "--dtype", "float32",
        "--kv-cache-memory-bytes", str(16 << 20)]


@pytest.fixture(scope="module")
def live():
    with serving(engine_args(override_generation_config=GREEDY), api_key=KEY) as server:
        yield server
        assert server.idle()


def cli(*argv: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`compiled-llm ARGV` of this checkout, the key in OPENAI_API_KEY (as vLLM reads it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": KEY,
           "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "compiled_llm.entrypoints.cli", *argv],
                          input=stdin, env=env, capture_output=True, encoding="utf-8",
                          timeout=timeout)


def chat_reply(server, messages: list[dict]) -> str:
    reply = server.post("/v1/chat/completions", {"messages": messages})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def completion(server, prompt: str, **body) -> str:
    reply = server.post("/v1/completions", {"prompt": prompt, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def test_chat_quick_streams_the_reply_of_the_listed_model(live):
    out = cli("chat", "--url", f"{live.url}/v1", "-q", "hi")
    assert out.returncode == 0, out.stderr
    expected = chat_reply(live, [{"role": "user", "content": "hi"}])
    assert out.stdout == f"Using model: {MODEL}\n{expected}\n"


def test_chat_loop_keeps_the_conversation(live):
    out = cli("chat", "--url", f"{live.url}/v1/", "--system-prompt", "be brief",
              stdin="hi\nand then?\n")
    assert out.returncode == 0, out.stderr
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    first = chat_reply(live, history)
    history += [{"role": "assistant", "content": first},
                {"role": "user", "content": "and then?"}]
    second = chat_reply(live, history)
    assert out.stdout == (f"Using model: {MODEL}\nPlease enter a message for the chat model:\n"
                          f"> {first}\n> {second}\n> ")


def test_complete_quick_and_loop(live):
    out = cli("complete", "--url", f"{live.url}/v1", "--model-name", MODEL, "--max-tokens",
              "5", "-q", "Once upon a time")
    assert out.returncode == 0, out.stderr
    expected = completion(live, "Once upon a time", max_tokens=5)
    assert out.stdout == f"Using model: {MODEL}\n{expected}\n"
    looped = cli("complete", "--url", f"{live.url}/v1", "--stats", stdin="a\nb\n")
    assert looped.returncode == 0, looped.stderr
    lines = looped.stdout.split("\n")
    assert lines[:2] == [f"Using model: {MODEL}", "Please enter prompt to complete:"]
    assert f"> {completion(live, 'a')}" in lines and f"> {completion(live, 'b')}" in lines
    assert looped.stdout.count("TTFT: ") == 2 and looped.stdout.count(" tokens/s (") == 2


def test_client_errors_are_reported(live):
    wrong_key = cli("chat", "--url", f"{live.url}/v1", "--api-key", "nope", "-q", "hi")
    assert wrong_key.returncode == 1 and "HTTP 401" in wrong_key.stderr
    unknown = cli("complete", "--url", f"{live.url}/v1", "--model-name", "other", "-q", "x")
    assert unknown.returncode == 1 and "HTTP 404" in unknown.stderr and "other" in unknown.stderr
    # in the loop a failed turn is said and the next one goes on
    looped = cli("chat", "--url", f"{live.url}/v1", "--model-name", "other", stdin="a\nb\n")
    assert looped.returncode == 0 and looped.stderr.count("HTTP 404") == 2
    down = cli("chat", "--url", "http://127.0.0.1:9/v1", "-q", "hi")
    assert down.returncode == 1 and "cannot reach" in down.stderr


def _line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_run_batch(live, tmp_path):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True}
    lines = [_line("chat", "/v1/chat/completions", chat),
             _line("cmpl", "/v1/completions", {"prompt": "Once", "max_tokens": 3,
                                                "ignore_eos": True}),
             "{not json", "",
             _line("bad-body", "/v1/completions", {"prompt": "x", "max_tokens": -1}),
             _line("bad-url", "/v1/nowhere", {}),
             _line("streamed", "/v1/completions", {"prompt": "x", "stream": True})]
    source, sink = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    model = engine_args().model
    out = cli("run-batch", "-i", str(source), "-o", str(sink), "--model", model,
              "--served-model-name", MODEL, *FAST, timeout=180)
    assert out.returncode == 0, out.stderr  # every line answered, the engine shut down
    entries = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [e["custom_id"] for e in entries] == ["chat", "cmpl", None, "bad-body", "bad-url",
                                                "streamed"]
    for e in entries:
        assert set(e) == {"id", "custom_id", "response", "error"}
        assert set(e["response"]) == {"status_code", "request_id", "body"}
    ok, answered = entries[:2], {e["response"]["request_id"] for e in entries}
    assert len(answered) == len(entries)
    assert [e["error"] for e in ok] == [None, None]
    assert [e["response"]["status_code"] for e in entries] == [200, 200, 400, 400, 400, 400]
    assert ok[0]["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    assert ok[0]["response"]["body"]["usage"]["completion_tokens"] == 4
    assert ok[1]["response"]["body"]["usage"]["completion_tokens"] == 3
    assert ok[0]["response"]["body"]["id"].endswith(ok[0]["response"]["request_id"])
    malformed, bad_body, bad_url, streamed = entries[2:]
    assert "line 3: not valid JSON" in malformed["error"]
    assert bad_body["response"]["body"] is None
    assert bad_body["error"]["error"]["param"] == "max_tokens"  # the server's own 400
    assert "Supported endpoints" in bad_url["error"] and "stream" in streamed["error"]


def test_run_batch_refuses_urls_before_building_an_engine(tmp_path):
    out = cli("run-batch", "-i", "https://example.com/in.jsonl", "-o", str(tmp_path / "o"),
              "--model", "unused")
    assert out.returncode == 2 and "only local files" in out.stderr
    missing = cli("run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o"))
    assert missing.returncode == 2 and "input_file" in missing.stderr


@pytest.mark.parametrize("argv", [["chat", "--system", "x"], ["complete", "--max-tok", "4"],
                                  ["run-batch", "-i", "a", "-o", "b", "--max-model", "8"]])
def test_abbreviated_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert "unrecognized arguments" in capsys.readouterr().err


def test_run_batch_takes_the_engine_and_request_flags():
    ns = build_parser().parse_args(["run-batch", "-i", "a", "-o", "b", "--model", "m",
                                    "--max-num-seqs", "3", "--response-role", "bot",
                                    "--served-model-name", "x", "y"])
    assert engine_args_of(ns).max_num_seqs == 3 and engine_args_of(ns).model == "m"
    assert (ns.response_role, ns.served_model_name) == ("bot", ["x", "y"])
    assert not hasattr(ns, "api_key") and not hasattr(ns, "allowed_origins")  # HTTP's only


def test_the_parser_imports_no_client_or_engine_stack():
    code = ("import sys; from compiled_llm.entrypoints.cli.main import build_parser; "
            "build_parser(); print(sorted({'torch', 'httpx', 'fastapi'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
