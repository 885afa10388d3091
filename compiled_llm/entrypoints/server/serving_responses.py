"""/v1/responses: the input rendered by the chat template (the path /v1/chat/completions
takes), one engine request, answered as one `response` object or streamed as Responses
events; stateless, nothing is stored."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.server.errors import OpenAIError, from_value_error
from compiled_llm.entrypoints.server.params import output_budget, sampling_params
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.responses_items import (
    LOGPROBS_INCLUDE,
    check_supported,
    message_item,
    messages,
    response_format,
    response_object,
    response_usage,
)
from compiled_llm.entrypoints.server.responses_stream import response_events
from compiled_llm.entrypoints.server.responses_tools import output_items, tool_constraint
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.streaming import abort_on_disconnect, chat_logprobs
from compiled_llm.output.outputs import CompletionOutput


@dataclass
class Admitted:
    """One admitted response request: its engine stream, ids and prompt length; num_top is
    the top-logprob count (None: no logprobs)."""

    stream: Any
    rid: str
    prompt_len: int
    num_top: int | None
    created: int = field(default_factory=lambda: int(time.time()))
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")


class ServingResponses(Serving):
    """The /v1/responses handler."""

    async def create(self, req: ResponsesRequest, raw: Request):
        """Answer one request: a `response` object, or its events when req.stream. A client
        that leaves aborts the request, admitted or not yet."""
        self.check_model(req.model)
        check_supported(req)
        if req.stream:
            admitted = await abort_on_disconnect(raw, self._admit(req))
            return StreamingResponse(response_events(self, req, admitted),
                                     media_type="text/event-stream")
        return JSONResponse(await abort_on_disconnect(raw, self._answer(req)))

    async def _admit(self, req: ResponsesRequest) -> Admitted:
        """Render, tokenize and admit; every 4xx comes before anything is queued."""
        fmt = tool_constraint(req) or response_format(req)
        ids = await self.encode_chat(messages(req), add_generation_prompt=True)
        budget = output_budget(req.max_output_tokens, len(ids), self.max_model_len,
                               prompt_param="input", budget_param="max_output_tokens")
        wants_logprobs = LOGPROBS_INCLUDE in (req.include or ()) or req.top_logprobs is not None
        num_top = (req.top_logprobs or 0) if wants_logprobs else None
        rid = f"resp_{uuid.uuid4().hex}"
        with _responses_names():
            params = sampling_params(req.model_copy(update={"response_format": fmt}), budget,
                                     num_top, req.stream)
            stream = await self.start(rid, ids, params)
        return Admitted(stream, rid, len(ids), num_top)

    async def _answer(self, req: ResponsesRequest) -> dict:
        """The whole `response` object (cancelled, it aborts the request)."""
        admitted = await self._admit(req)
        try:
            out = await self.last(admitted.stream)
        finally:
            admitted.stream.abort()
        self.check_output(out)
        completion = out.outputs[0]
        logprobs = self.logprobs(completion, admitted.num_top)
        return self.final(req, admitted, completion.text, completion.finish_reason,
                          len(completion.token_ids), logprobs)[0]

    @staticmethod
    def logprobs(completion: CompletionOutput, num_top: int | None) -> list | None:
        """The output_text logprobs of completion's tokens (None when not asked for)."""
        if num_top is None or completion.logprobs is None:
            return None
        return chat_logprobs(completion.token_ids, completion.logprobs, num_top)["content"]

    def final(self, req: ResponsesRequest, admitted: Admitted, text: str,
              finish_reason: str | None, output_tokens: int,
              logprobs: list | None) -> tuple[dict, list]:
        """(the finished `response` object, its output items); a generation cut by the
        token budget is "incomplete"."""
        status = "incomplete" if finish_reason == "length" else "completed"
        items = output_items(
            text, lambda body: message_item(admitted.item_id, body, status, logprobs))
        body = response_object(req, admitted.rid, self.model_name, admitted.created,
                               status=status, output=items,
                               usage=response_usage(admitted.prompt_len, output_tokens))
        return body, items


# what the sampling fields and the engine call a field -> what /v1/responses calls it
_RESPONSES_NAMES = {"response_format": "text.format", "structured_outputs": "text.format",
                    "logprobs": "top_logprobs", "max_tokens": "max_output_tokens"}


@contextlib.contextmanager
def _responses_names():
    """A 400 from the shared sampling fields or the engine (a grammar that does not compile,
    too many logprobs) names the field as this endpoint's client sent it."""
    try:
        yield
    except (OpenAIError, ValueError) as exc:
        err = exc if isinstance(exc, OpenAIError) else from_value_error(exc)
        name = _RESPONSES_NAMES.get(err.param)
        if name is None:
            raise
        message = err.message.replace(err.param, name, 1) if err.param in err.message \
            else f"{name}: {err.message}"
        raise OpenAIError(err.status, message, param=name, code=err.code) from None
