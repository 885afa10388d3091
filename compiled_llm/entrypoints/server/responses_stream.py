"""The event stream of a streamed /v1/responses request, in the order OpenAI's SDK parses:
response.created, response.in_progress, output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done, then
response.completed (or response.incomplete; response.failed on an error), each numbered."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.responses_items import message_item, response_object

if TYPE_CHECKING:
    from compiled_llm.entrypoints.server.serving_responses import Admitted, ServingResponses


class _Events:
    """Numbers events in the order sent (sequence_number from 0) and formats them as SSE."""

    def __init__(self) -> None:
        self._numbers = itertools.count()

    def __call__(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": next(self._numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def response_events(serving: ServingResponses, req: ResponsesRequest,
                          admitted: Admitted) -> AsyncIterator[str]:
    """The whole event stream of one admitted request; closing it aborts the request."""
    event = _Events()
    part = {"item_id": admitted.item_id, "output_index": 0, "content_index": 0}
    for opening in _opening(event, serving, req, admitted, part):
        yield opening
    texts: list[str] = []
    logprobs: list = []
    pending: list = []  # logprobs of tokens whose text is held back (part of a character)
    output_tokens, finish_reason = 0, None
    try:
        async for out in admitted.stream:
            serving.check_output(out)
            completion = out.outputs[0]
            output_tokens += len(completion.token_ids)
            finish_reason = completion.finish_reason or finish_reason
            pending += serving.logprobs(completion, admitted.num_top) or []
            if completion.text:
                texts.append(completion.text)
                yield event("response.output_text.delta", **part, delta=completion.text,
                            logprobs=pending)
                logprobs, pending = logprobs + pending, []
    except OpenAIError as exc:
        yield _failed(event, serving, req, admitted, exc)
        return
    finally:  # a client gone mid-stream closes us: free its blocks now
        admitted.stream.abort()
    text, logprobs = "".join(texts), logprobs + pending
    body, items = serving.final(req, admitted, text, finish_reason, output_tokens, logprobs)
    yield event("response.output_text.done", **part, text=text, logprobs=logprobs)
    yield event("response.content_part.done", **part, part=items[0]["content"][0])
    yield event("response.output_item.done", output_index=0, item=items[0])
    yield event(f"response.{body['status']}", response=body)


def _opening(event: _Events, serving: ServingResponses, req: ResponsesRequest,
             admitted: Admitted, part: dict) -> list[str]:
    """The events before the first token: the response in progress, its empty message
    item and empty output_text part."""
    started = response_object(req, admitted.rid, serving.model_name, admitted.created,
                              status="in_progress", output=[])
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [event("response.created", response=started),
            event("response.in_progress", response=started),
            event("response.output_item.added", output_index=0,
                  item=message_item(admitted.item_id, "", "in_progress", None)),
            event("response.content_part.added", **part, part=empty)]


def _failed(event: _Events, serving: ServingResponses, req: ResponsesRequest,
            admitted: Admitted, exc: OpenAIError) -> str:
    """response.failed, carrying the error, for a generation that failed mid-stream."""
    failed = response_object(req, admitted.rid, serving.model_name, admitted.created,
                             status="failed", output=[],
                             error={"code": exc.code or "server_error", "message": exc.message})
    return event("response.failed", response=failed)
