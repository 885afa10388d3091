"""The event stream of a streamed /v1/responses request, in the order OpenAI's SDK parses:
response.created, response.in_progress, then each output item as the reply reaches it (its
deltas between output_item.added and .done), one open at a time, then response.completed (status
"incomplete" where max_output_tokens cut it, as vLLM sends; response.failed on an error), every
event numbered."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.responses_items import (
    function_call_item,
    message_item,
    new_call_ids,
    reasoning_item,
    response_object,
)

if TYPE_CHECKING:
    from compiled_llm.entrypoints.server.serving_responses import Admitted, ServingResponses


class _Events:
    """Numbers events in the order sent (sequence_number from 0) and formats them as SSE."""

    def __init__(self) -> None:
        self._numbers = itertools.count()

    def __call__(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": next(self._numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Items:
    """The output items of one stream: one open at a time, opened when the reply's deltas
    reach it and closed (in its final shape, kept in `items`) before the next opens."""

    def __init__(self, event: _Events) -> None:
        self.event, self.items = event, []
        self._kind: str | None = None  # the open item's type
        self._id = self._name = self._text = ""
        self._logprobs: list = []

    def feed(self, delta: dict[str, Any], logprobs: list) -> list[str]:
        """The events of one reply delta (reasoning_content, content, tool_calls)."""
        out = []
        if delta.get("reasoning_content"):
            out += self._ensure("reasoning")
            out.append(self._text_delta("response.reasoning_text.delta",
                                        delta["reasoning_content"]))
        if delta.get("content"):
            out += self._ensure("message")
            self._logprobs += logprobs
            out.append(self._text_delta("response.output_text.delta", delta["content"],
                                        logprobs=logprobs))
        for call in delta.get("tool_calls") or ():
            if "id" in call:  # a new call: the item before it is done
                out += self.close("completed") + self._open_call(call["function"]["name"])
            arguments = call["function"].get("arguments")
            if arguments:
                self._text += arguments
                out.append(self.event("response.function_call_arguments.delta",
                                      item_id=self._id, output_index=len(self.items) - 1,
                                      delta=arguments))
        return out

    def finish(self, status: str, logprobs: list) -> list[str]:
        """The events closing the stream's last item (an empty message when the reply made
        neither a message nor a call); logprobs: those no delta carried yet."""
        out = []
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            out += self._ensure("message")
        if self._kind == "message":
            self._logprobs += logprobs
        return out + self.close(status)

    def close(self, status: str) -> list[str]:
        """The events closing the open item (none when none is open)."""
        kind, index, self._kind = self._kind, len(self.items) - 1, None
        if kind is None:
            return []
        at = {"item_id": self._id, "output_index": index}
        if kind == "function_call":
            self.items[index] = function_call_item(self._name, self._text, status,
                                                   (self._id, self.items[index]["call_id"]))
            return [self.event("response.function_call_arguments.done", **at,
                               arguments=self._text),
                    self.event("response.output_item.done", output_index=index,
                               item=self.items[index])]
        if kind == "message":
            item = message_item(self._id, self._text, status, self._logprobs)
            done = self.event("response.output_text.done", **at, content_index=0,
                              text=self._text, logprobs=self._logprobs)
        else:
            item = reasoning_item(self._id, self._text, status)
            done = self.event("response.reasoning_text.done", **at, content_index=0,
                              text=self._text)
        self.items[index] = item
        return [done, self.event("response.content_part.done", **at, content_index=0,
                                 part=item["content"][0]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def _ensure(self, kind: str) -> list[str]:
        """Open a message or reasoning item unless that kind is the open one."""
        if self._kind == kind:
            return []
        out = self.close("completed")
        prefix, part = ("msg", {"type": "output_text", "text": "", "annotations": [],
                                "logprobs": []}) if kind == "message" else \
            ("rs", {"type": "reasoning_text", "text": ""})
        self._kind, self._id, self._text = kind, f"{prefix}_{uuid.uuid4().hex}", ""
        opened = message_item(self._id, "", "in_progress", None) if kind == "message" else \
            reasoning_item(self._id, "", "in_progress")
        self.items.append(opened)
        index = len(self.items) - 1
        return out + [self.event("response.output_item.added", output_index=index,
                                 item=opened),
                      self.event("response.content_part.added", item_id=self._id,
                                 output_index=index, content_index=0, part=part)]

    def _open_call(self, name: str) -> list[str]:
        ids = new_call_ids()
        self._kind, self._id, self._name, self._text = "function_call", ids[0], name, ""
        self.items.append(function_call_item(name, "", "in_progress", ids))
        return [self.event("response.output_item.added", output_index=len(self.items) - 1,
                           item=self.items[-1])]

    def _text_delta(self, kind: str, text: str, **extra) -> str:
        self._text += text
        return self.event(kind, item_id=self._id, output_index=len(self.items) - 1,
                          content_index=0, delta=text, **extra)


async def response_events(serving: ServingResponses, req: ResponsesRequest,
                          admitted: Admitted) -> AsyncIterator[str]:
    """The whole event stream of one admitted request; closing it aborts the request."""
    event = _Events()
    started = response_object(req, admitted.rid, serving.reply_model(req.model),
                              admitted.created, status="in_progress", output=[])
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    items, streamer = _Items(event), admitted.reply.streamer()
    token_ids: list[int] = []
    logprobs: list = []
    sent = thinking = 0  # logprobs given to deltas; tokens of the thinking span
    finish_reason = None
    try:
        async for out in admitted.stream:
            serving.check_output(out)
            completion = out.outputs[0]
            token_ids += completion.token_ids
            finish_reason = completion.finish_reason or finish_reason
            logprobs += serving.logprobs(completion, admitted.num_top) or []
            delta = streamer.feed(completion.text, completion.finish_reason is not None)
            thinking = admitted.reasoning_tokens(streamer.text, token_ids,
                                                 completion.finish_reason is not None)
            # a delta's text may end in part of a character: its logprobs wait for the next
            fresh = logprobs[max(sent, thinking):] if delta.get("content") else []
            sent = len(logprobs) if fresh else sent
            for chunk in items.feed(delta, fresh):
                yield chunk
    except OpenAIError as exc:
        yield _failed(event, serving, req, admitted, exc)
        return
    finally:  # a client gone mid-stream closes us: free its blocks now
        admitted.stream.abort()
    status = "incomplete" if finish_reason == "length" else "completed"
    for chunk in items.finish(status, logprobs[max(sent, thinking):]):
        yield chunk
    body = serving.final(req, admitted, status, items.items, len(token_ids), thinking)
    # vLLM ends every finished stream with response.completed, a cut one too (status
    # "incomplete"): the SDK's .stream() builds get_final_response() from that event only
    yield event("response.completed", response=body)


def _failed(event: _Events, serving: ServingResponses, req: ResponsesRequest,
            admitted: Admitted, exc: OpenAIError) -> str:
    """response.failed, carrying the error, for a generation that failed mid-stream."""
    failed = response_object(req, admitted.rid, serving.reply_model(req.model),
                             admitted.created, status="failed", output=[],
                             error={"code": exc.code or "server_error", "message": exc.message})
    return event("response.failed", response=failed)
