"""Plumbing shared by the handlers: server-sent events, merging several request streams into
one, aborting on client disconnect, and OpenAI's logprob and usage shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.output.outputs import Logprob

ResultT = TypeVar("ResultT")
DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    """payload as one server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def choice_events(fields: dict) -> Callable[..., str]:
    """A builder of one response's events {**fields, "choices": choices, **extra}, the same
    text as sse() makes: without extra, the fixed fields (non-empty) are encoded once and only
    the choices each event."""
    head = "data: " + json.dumps(fields, ensure_ascii=False)[:-1] + ', "choices": '

    def event(choices: list, **extra) -> str:
        if extra:  # usage and the like, after the choices
            return sse({**fields, "choices": choices, **extra})
        return f"{head}{json.dumps(choices, ensure_ascii=False)}}}\n\n"

    return event


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          reasoning_tokens: int | None = None) -> dict:
    """OpenAI's `usage` object; with cached_tokens, its prompt_tokens_details too; with
    reasoning_tokens (a server with a reasoning parser, as vLLM), completion_tokens_details."""
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


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

    async def pump(index: int, stream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.abort()


async def _disconnected(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def abort_on_disconnect(raw: Request, work: Awaitable[ResultT]) -> ResultT:
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


def _top(entry: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(((token_id, logprob) for token_id, logprob in entry.items()
                     if logprob.rank is not None and logprob.rank <= num_top),
                    key=lambda item: item[1].rank)
    return ranked[:num_top]


def _token_text(token_id: int, logprob: Logprob, as_ids: bool = False) -> str:
    """A token as logprobs show it: its text, or (as_ids: vLLM's return_tokens_as_token_ids,
    or no text known) "token_id:{id}"."""
    if as_ids or logprob.decoded_token is None:
        return f"token_id:{token_id}"
    return logprob.decoded_token


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], num_top: int,
                  as_ids: bool = False) -> dict:
    """OpenAI chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]};
    as_ids shows every token as "token_id:{id}"."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry[token_id]
        text = _token_text(token_id, chosen, as_ids)
        tops = [{"token": (top_text := _token_text(top_id, top, as_ids)),
                 "logprob": _finite(top.logprob), "bytes": list(top_text.encode())}
                for top_id, top in _top(entry, num_top)]
        content.append({"token": text, "logprob": _finite(chosen.logprob),
                        "bytes": list(text.encode()), "top_logprobs": tops})
    return {"content": content}


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob] | None],
                        num_top: int, offset: int, unscored: str = "",
                        as_ids: bool = False) -> dict:
    """OpenAI completions `logprobs`; text offsets start at offset. A None entry (an echoed
    prompt's first token, which nothing predicts) gets null logprobs and the text unscored.
    Each top_logprobs dict holds the chosen token first, then the num_top best (OpenAI and
    vLLM: up to num_top + 1 entries, so logprobs=0 still shows the chosen token's). as_ids
    shows every token as "token_id:{id}"."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        if entry is None:
            text = f"token_id:{token_id}" if as_ids else unscored
        else:
            text = _token_text(token_id, entry[token_id], as_ids)
        tokens.append(text)
        logprobs.append(None if entry is None else _finite(entry[token_id].logprob))
        tops.append(None if entry is None else _completion_top(token_id, entry, num_top,
                                                               as_ids))
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": offsets}


def _completion_top(token_id: int, entry: dict[int, Logprob], num_top: int,
                    as_ids: bool = False) -> dict:
    """{text: logprob} of the chosen token, then of the num_top best (a text already there,
    the chosen token's included, keeps its first logprob)."""
    top: dict[str, float] = {}
    for top_id, logprob in [(token_id, entry[token_id]), *_top(entry, num_top)]:
        top.setdefault(_token_text(top_id, logprob, as_ids), _finite(logprob.logprob))
    return top


def stream_usage(options, force: bool) -> tuple[bool, bool]:
    """(a last chunk with the usage, every chunk with the usage so far) of a stream: its
    stream_options' include_usage, or force (--enable-force-include-usage); vLLM's
    continuous_usage_stats counts only together with include_usage."""
    final = bool(force or (options and options.include_usage))
    return final, bool(final and options and options.continuous_usage_stats)


def _finite(logprob: float) -> float:
    """-inf as the finite floor OpenAI and vLLM send (JSON has no infinity)."""
    return max(logprob, -9999.0)


def prompt_logprobs_json(rows: list[dict[int, Logprob] | None] | None) -> list | None:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob,
    rank, decoded_token}} for the token itself and the top ones."""
    if rows is None:
        return None
    return [None if row is None else {
        str(token_id): {"logprob": _finite(lp.logprob), "rank": lp.rank,
                        "decoded_token": lp.decoded_token}
        for token_id, lp in row.items()} for row in rows]
