"""One hostile request per row of issue 12's table, sent one after another while healthy
clients stream completions: what each hostile request got, and the longest a healthy request
waited (for its first token or the next) while a hostile one was in flight.

`python -m tests.entrypoints.server.hostile` measures it on the demo model with the default
limits (the figures in docs/hardening.md); test_cross_request.py runs it on the test model.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

from tests.entrypoints.server.inprocess import MODEL, InProcessServer

BIG = "fox " * (10 << 18)  # 10 MB of text


def _schema(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(
        properties)}}


def hostile_requests(slow_properties: int) -> list[tuple[str, str, dict, dict]]:
    """(name, path, JSON body, extra headers) per row; slow_properties sizes a schema under
    the size limit that compiles past the time limit."""
    comp = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return [
        ("row1 seed 2**64", "/v1/completions", {**comp, "seed": 2 ** 64}, {}),
        ("row1 top_k 2**63", "/v1/completions", {**comp, "top_k": 2 ** 63}, {}),
        ("row1 stop id outside the vocab", "/v1/completions",
         {**comp, "stop_token_ids": [10 ** 6], "min_tokens": 2}, {}),
        ("row2 schema of 20,000 properties", "/v1/chat/completions",
         {**chat, "guided_json": _schema(20_000)}, {}),
        ("row2 schema slow to compile", "/v1/chat/completions",
         {**chat, "guided_json": _schema(slow_properties)}, {}),
        ("row3 100k choices", "/v1/completions",
         {**comp, "guided_choice": [f"choice {i}" for i in range(100_000)]}, {}),
        # the key guards /v1 alone (vLLM's rule): /tokenize is open
        ("row4 /v1/completions 10 MB without the key", "/v1/completions",
         {**comp, "prompt": BIG}, {"auth": ""}),
        ("row4 /tokenize 10 MB", "/tokenize", {"prompt": BIG}, {}),
        ("row5 template loop", "/v1/chat/completions", {**chat, "chat_template_kwargs": {
            "chat_template": "{% for i in range(10000) %}{% for j in range(10000) %}x"
                             "{% endfor %}{% endfor %}"}}, {}),
        ("row6 n=100000", "/v1/completions", {**comp, "n": 100_000}, {}),
        ("row7 10 MB prompt", "/v1/completions", {**comp, "prompt": BIG}, {}),
        ("5,000 stop strings", "/v1/completions",
         {**comp, "stop": [f"{i}" + "y" * 200 for i in range(5000)]}, {}),
        ("row8 lone surrogate", "/v1/completions", {**comp, "prompt": "a\ud800b"}, {}),
        ("row9 header not UTF-8", "/health", {}, {"x-note": b"caf\xe9"}),
        ("row10 any_whitespace yes", "/v1/completions", {**comp, "structured_outputs": {
            "json_object": True, "any_whitespace": "yes"}}, {}),
        ("row11 10,000 prompts", "/v1/completions", {**comp, "prompt": ["hi"] * 10_000}, {}),
        ("row12 empty prompt", "/v1/completions", {**comp, "prompt": ""}, {}),
        ("row14 max_completion_tokens 0", "/v1/chat/completions",
         {**chat, "max_completion_tokens": 0}, {}),
        ("row14 choice a string", "/v1/completions",
         {**comp, "structured_outputs": {"choice": "abc"}}, {}),
        ("row15 bools as ids", "/v1/completions", {**comp, "prompt": [True, 5]}, {}),
        ("row16 context too long", "/v1/completions", {**comp, "prompt": [5] * 5000}, {}),
        ("row17 /v1/chat/completions without the key", "/v1/chat/completions", chat,
         {"auth": ""}),
    ]


@dataclass
class Report:
    """What a run saw: each hostile request's status and seconds, the healthy requests'
    outcomes, and the longest healthy wait overlapping a hostile request (and which)."""

    hostile: list[tuple[str, int, float]] = field(default_factory=list)
    healthy_done: int = 0
    healthy_failed: list[str] = field(default_factory=list)
    longest_wait_s: float = 0.0
    longest_wait_during: str = ""
    longest_quiet_wait_s: float = 0.0  # with no hostile request in flight, for comparison
    healthy_gaps: list[tuple[float, float]] = field(default_factory=list)


def _send(srv: InProcessServer, path: str, body: dict, extra: dict) -> int:
    headers = dict(srv.headers)
    if extra.pop("auth", None) is not None:
        headers.pop("Authorization", None)
    raw = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in extra.items()]
    method = "GET" if path == "/health" else "POST"
    content = None if method == "GET" else json.dumps(body).encode()  # ASCII: \\ud800 escaped
    r = httpx.request(method, f"{srv.url}{path}", content=content, timeout=300,
                      headers=[*headers.items(), ("Content-Type", "application/json"), *raw])
    return r.status_code


def _healthy_client(srv: InProcessServer, stop: threading.Event, report: Report,
                    max_tokens: int) -> None:
    """Stream completions one after another until stop; every gap between the request's
    start and its first event, and between events, goes to report.healthy_gaps."""
    body = {"model": MODEL, "prompt": "The quick brown", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    while not stop.is_set():
        last, reason = time.monotonic(), None
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, headers=srv.headers,
                          timeout=300) as r:
            for line in r.iter_lines():
                now = time.monotonic()
                report.healthy_gaps.append((last, now))
                last = now
                if line.startswith("data: {"):
                    reason = json.loads(line[6:])["choices"][0]["finish_reason"] or reason
        if reason == "length":
            report.healthy_done += 1
        else:
            report.healthy_failed.append(str(reason))


def run(srv: InProcessServer, slow_properties: int, clients: int = 4,
        max_tokens: int = 64) -> Report:
    """Send every hostile request, one after another, among `clients` healthy streams."""
    report, stop = Report(), threading.Event()
    threads = [threading.Thread(target=_healthy_client, args=(srv, stop, report, max_tokens))
               for _ in range(clients)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while len(report.healthy_gaps) < 2 * clients:  # every client is streaming
        assert time.monotonic() < deadline, "the healthy clients never streamed"
        time.sleep(0.01)
    windows = []
    for name, path, body, extra in hostile_requests(slow_properties):
        start = time.monotonic()
        status = _send(srv, path, body, dict(extra))
        windows.append((name, start, time.monotonic()))
        report.hostile.append((name, status, windows[-1][2] - start))
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    for begin, end in report.healthy_gaps:
        during = [name for name, start, finish in windows if begin < finish and end > start]
        if not during:
            report.longest_quiet_wait_s = max(report.longest_quiet_wait_s, end - begin)
        elif end - begin > report.longest_wait_s:
            report.longest_wait_s, report.longest_wait_during = end - begin, during[0]
    return report


def main() -> None:
    """The figures of docs/hardening.md: the demo model, the default limits, with a key."""
    from compiled_llm.config import EngineArgs
    from tests.entrypoints.server.inprocess import serving

    args = EngineArgs(enforce_eager=True, dtype="float32")
    with serving(args, api_key="sk-hostile") as srv:
        report = run(srv, slow_properties=2200)
    for name, status, seconds in report.hostile:
        print(f"{status}  {seconds:6.2f} s  {name}")
    print(f"healthy requests finished: {report.healthy_done}, failed: {report.healthy_failed}")
    print(f"longest healthy wait during a hostile request: {report.longest_wait_s:.3f} s "
          f"({report.longest_wait_during}); with none in flight: "
          f"{report.longest_quiet_wait_s:.3f} s")


if __name__ == "__main__":
    main()
