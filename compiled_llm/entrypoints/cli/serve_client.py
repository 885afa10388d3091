"""The client of `bench serve`: streamed requests to an OpenAI-compatible server, each timed
from its send to its first and every later event, sent by one asyncio loop or split over
several client processes started together (one Python process reads about 6k streamed events
a second, fewer than a fast server sends at a few hundred streams)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import queue
import random
import time
import traceback
from dataclasses import dataclass, field

import httpx

# time.perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process of the machine,
# so the starts and ends that client processes report can be compared


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from its send."""

    prompt_len: int = 0
    """Prompt tokens: the server's usage count, else the ids sent (0 for text)."""
    output_tokens: int = 0
    """Generated tokens, from the usage of the last event."""
    start: float = 0.0
    """perf_counter() when the request was sent."""
    ttft: float = 0.0
    """Time to the first event that carries tokens."""
    latency: float = 0.0
    """Time to the end of the stream."""
    itl: list[float] = field(default_factory=list)
    """Gaps between successive token-carrying events (one event may carry several tokens
    when the client reads slower than the server writes; vLLM's client counts it the same)."""
    error: str = ""
    """What went wrong, if anything."""
    ok: bool = False
    """The stream ended with [DONE] and a usage of at least one generated token."""


@dataclass
class ClientShare:
    """What one client process sends, and how."""

    url: str
    """The endpoint's full URL."""
    bodies: list[dict]
    """Request bodies, sent in this order."""
    chat: bool = False
    """The bodies are chat completions (the first event carries the role, no token)."""
    concurrency: int | None = None
    """At most this many in flight (None: all at once)."""
    rate: float = float("inf")
    """Arrivals at this many requests/s on average (inf: no waits)."""
    seed: int = 0
    """Seeds the arrival times."""
    burstiness: float = 1.0
    """Shape of the gamma-distributed gaps between arrivals (1: a Poisson process)."""
    headers: dict = field(default_factory=dict)
    """Sent with every request (authorization)."""


def _carries_tokens(event: dict, chat: bool) -> bool:
    """Whether an event holds new tokens: any with choices, but chat's leading role delta."""
    choices = event.get("choices")
    return bool(choices) and not (chat and "role" in choices[0].get("delta", {}))


def sse_split(pending: bytes) -> tuple[list[str], bytes]:
    """The complete lines of an event stream's bytes so far and the rest, split at LF only
    (SSE's line ends; str.splitlines, which httpx's iter_lines follows, would also split JSON
    strings at U+2028, U+0085 ...)."""
    *lines, rest = pending.split(b"\n")
    return [line.rstrip(b"\r").decode("utf-8") for line in lines], rest


async def sse_lines(response: httpx.Response):
    """The lines of an event stream (sse_split's)."""
    pending = b""
    async for chunk in response.aiter_bytes():
        lines, pending = sse_split(pending + chunk)
        for line in lines:
            yield line
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8")


async def _read_stream(response: httpx.Response, rec: RequestRecord, chat: bool) -> None:
    """Fill rec from the events of one streamed answer."""
    last = rec.start
    async for line in sse_lines(response):
        if not line.startswith("data: "):
            continue
        now = time.perf_counter()  # before parsing: the event's arrival, not our work on it
        if line == "data: [DONE]":
            rec.ok = rec.output_tokens > 0 and not rec.error
            return
        event = json.loads(line[6:])
        if "error" in event:
            rec.error = json.dumps(event["error"])[:300]
        if event.get("usage"):
            rec.output_tokens = event["usage"]["completion_tokens"]
            rec.prompt_len = event["usage"]["prompt_tokens"]
        if not _carries_tokens(event, chat):
            continue
        if last == rec.start:
            rec.ttft = now - rec.start
        else:
            rec.itl.append(now - last)
        last = now


async def send_one(client: httpx.AsyncClient, url: str, body: dict,
                   chat: bool = False) -> RequestRecord:
    """Send one streamed request and time its events."""
    prompt = body.get("prompt", ())
    rec = RequestRecord(prompt_len=len(prompt) if isinstance(prompt, list) else 0,
                        start=time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                rec.error = f"HTTP {response.status_code}: {text[:300]}"
                return rec
            await _read_stream(response, rec, chat)
        rec.latency = time.perf_counter() - rec.start
    except httpx.HTTPError as e:
        rec.error = repr(e)
    if not rec.ok and not rec.error:
        rec.error = "the stream ended without [DONE] or without generated tokens"
    return rec


def arrival_gap(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    """Seconds to the next arrival, as vLLM draws them: gamma-distributed with shape
    `burstiness` and mean 1/rate (shape 1 is exponential: a Poisson process); 0 at rate inf."""
    if rate == float("inf"):
        return 0.0
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


async def run_share(share: ClientShare) -> tuple[list[RequestRecord], float, float]:
    """Send a share's requests; (their records in order, perf_counter at start, at end)."""
    rng = random.Random(share.seed)
    gate = asyncio.Semaphore(share.concurrency or len(share.bodies))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits, headers=share.headers) as client:
        async def limited(body: dict) -> RequestRecord:
            async with gate:
                return await send_one(client, share.url, body, share.chat)

        tasks = []
        start = time.perf_counter()
        for body in share.bodies:
            tasks.append(asyncio.create_task(limited(body)))
            if share.rate != float("inf"):
                await asyncio.sleep(arrival_gap(rng, share.rate, share.burstiness))
        records = await asyncio.gather(*tasks)
    return list(records), start, time.perf_counter()


def split(bodies: list[dict], processes: int, concurrency: int | None, rate: float,
          seed: int, **share_kw) -> list[ClientShare]:
    """The requests dealt round-robin over at most `processes` shares, each with its part of
    the concurrency and of the rate (independent Poisson streams add up to one of the sum;
    gamma ones of --burstiness other than 1 merge into a stream closer to Poisson)."""
    count = min(processes, len(bodies), concurrency or len(bodies))
    shares = []
    for k in range(count):
        part = None if concurrency is None else concurrency // count + (k < concurrency % count)
        shares.append(ClientShare(bodies=bodies[k::count], concurrency=part, rate=rate / count,
                                  seed=seed + k, **share_kw))
    return shares


def _client_process(index: int, share: ClientShare, barrier, results) -> None:
    """A client process: wait for the others, send its share, report (index, outcome)."""
    try:
        barrier.wait(timeout=300)
        results.put((index, asyncio.run(run_share(share))))
    except BaseException:
        results.put((index, traceback.format_exc()))


def run_clients(shares: list[ClientShare]) -> tuple[list[RequestRecord], float]:
    """Run the shares, one spawned process each (in this process when there is one), from a
    common start; (every record, seconds from the first start to the last end)."""
    if len(shares) == 1:
        records, start, end = asyncio.run(run_share(shares[0]))
        return records, end - start
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    barrier, results = ctx.Barrier(len(shares)), ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(k, share, barrier, results),
                         daemon=True) for k, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    try:
        parts = dict(_collect(procs, results))
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    records: list = [None] * sum(len(share.bodies) for share in shares)
    for k, (part, _, _) in parts.items():  # share k holds requests k, k + n, k + 2n, ...
        records[k::len(shares)] = part
    return records, max(p[2] for p in parts.values()) - min(p[1] for p in parts.values())


def _collect(procs: list, results) -> list[tuple[int, tuple]]:
    """Each process's report, read while they run (a large report blocks its sender until
    read); a process that fails or dies raises RuntimeError."""
    parts = []
    while len(parts) < len(procs):
        try:
            index, outcome = results.get(timeout=1.0)
        except queue.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                raise RuntimeError("a client process died without reporting") from None
            continue
        if isinstance(outcome, str):
            raise RuntimeError(f"client process {index} failed:\n{outcome}")
        parts.append((index, outcome))
    return parts
