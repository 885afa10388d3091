"""Plumbing shared by the handlers: server-sent events, merging several request streams into
one, aborting on client disconnect, and OpenAI's logprob and usage shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.output.outputs import Logprob

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merge_streams(streams: list) -> AsyncIterator[tuple[int, Any]]:
    """(index, output) from several request streams as they come; closing aborts them all."""
    if len(streams) == 1:  # the common case needs no tasks
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].abort()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def _disconnected(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def abort_on_disconnect(raw: Request, work: Awaitable[T]) -> T:
    """Await work, cancelling it (which aborts its requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(raw))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise OpenAIError(499, "client disconnected", code="client_closed_request")


def _top(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(((t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k),
                    key=lambda x: x[1].rank)
    return ranked[:k]


def _token_text(tid: int, lp: Logprob) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{tid}"


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int) -> dict:
    """OpenAI chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    content = []
    for tid, entry in zip(token_ids, entries):
        lp = entry[tid]
        text = _token_text(tid, lp)
        tops = [{"token": (s := _token_text(t, x)), "logprob": x.logprob,
                 "bytes": list(s.encode())} for t, x in _top(entry, k)]
        content.append({"token": text, "logprob": lp.logprob, "bytes": list(text.encode()),
                        "top_logprobs": tops})
    return {"content": content}


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int,
                        offset: int) -> dict:
    """OpenAI completions `logprobs`; text offsets start at offset."""
    tokens, lps, tops, offsets = [], [], [], []
    for tid, entry in zip(token_ids, entries):
        text = _token_text(tid, entry[tid])
        tokens.append(text)
        lps.append(entry[tid].logprob)
        tops.append({_token_text(t, x): x.logprob for t, x in _top(entry, k)})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}
