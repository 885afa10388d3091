"""/v1/responses: the input rendered by the chat template with its tools (the path
/v1/chat/completions takes), one engine request whose reply is read for reasoning and function
calls as chat's is, answered as one `response` object or streamed as Responses events;
finished responses are kept (responses_store.py) for previous_response_id and
GET /v1/responses/{id}."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.chat_utils import with_reasoning_effort
from compiled_llm.entrypoints.server.errors import renamed_params
from compiled_llm.entrypoints.server.params import output_budget, sampling_params
from compiled_llm.entrypoints.server.protocol import ChatMessage
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.reply import ReplyFormat, reasoning_token_count, reply_params
from compiled_llm.entrypoints.server.responses_items import (
    LOGPROBS_INCLUDE,
    check_supported,
    messages,
    reasoning_effort,
    response_format,
    response_object,
    response_usage,
)
from compiled_llm.entrypoints.server.responses_store import ResponseStore, output_messages
from compiled_llm.entrypoints.server.responses_stream import response_events
from compiled_llm.entrypoints.server.responses_tools import (
    check_tool_format,
    output_items,
    responses_plan,
    tool_names,
)
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.streaming import abort_on_disconnect, chat_logprobs
from compiled_llm.output.outputs import CompletionOutput


@dataclass
class Admitted:
    """One admitted response request: its engine stream, id and prompt length; num_top is
    the top-logprob count (None: no logprobs); reply reads the output for reasoning and
    function calls; end_id is the thinking span's end token (None: no span to count)."""

    stream: Any
    rid: str
    prompt_len: int
    num_top: int | None
    reply: ReplyFormat
    end_id: int | None = None
    conversation: list[ChatMessage] = field(default_factory=list)
    """The input as chat messages (after any previous response's, instructions left out):
    what a stored response keeps for the next previous_response_id."""
    created: int = field(default_factory=lambda: int(time.time()))

    def reasoning_tokens(self, text: str, token_ids: list[int], final: bool) -> int:
        """How many of token_ids (the output so far, whose text is text) are thinking."""
        reasoning, _ = self.reply.split(text, final)
        return reasoning_token_count(reasoning, token_ids, self.end_id)


class ServingResponses(Serving):
    """The /v1/responses handler; store keeps finished responses (responses_store.py)."""

    def __init__(self, *args, store_dir: str | None = None, **kwargs) -> None:
        """store_dir: where several API server processes share their stored responses."""
        super().__init__(*args, **kwargs)
        self.store = ResponseStore(directory=store_dir)

    def retrieve(self, rid: str) -> dict:
        """GET /v1/responses/{rid}: the stored response (a 404 when not kept)."""
        return self.store.response(rid)

    def delete(self, rid: str) -> dict:
        """DELETE /v1/responses/{rid}: forget it (a 404 when not kept), OpenAI's answer."""
        self.store.response(rid)
        self.store.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

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
        """Render (with the tools), tokenize and admit; every 4xx comes before anything is
        queued."""
        plan = responses_plan(req, self.tool_plan)
        fmt = response_format(req)
        check_tool_format(plan, fmt)
        history = messages(req, tool_names(plan),
                           self.store.conversation(req.previous_response_id))
        kwargs = with_reasoning_effort(req.chat_template_kwargs, reasoning_effort(req))
        ids = await self.encode_chat(history, True, kwargs, plan.tools)
        budget = output_budget(req.max_output_tokens, len(ids), self.max_model_len,
                               prompt_param="input", budget_param="max_output_tokens",
                               **self.budget_limits)
        wants_logprobs = LOGPROBS_INCLUDE in (req.include or ()) or req.top_logprobs is not None
        num_top = (req.top_logprobs or 0) if wants_logprobs else None
        reply = self.reply_format(plan, ids, kwargs)
        rid = f"resp_{uuid.uuid4().hex}"
        with renamed_params(_RESPONSES_NAMES):
            params = sampling_params(req.model_copy(update={"response_format": fmt}), budget,
                                     num_top, req.stream,
                                     defaults=self.sampling_defaults)
            params = reply_params(params, reply, self.engine.tokenizer,
                                  req.thinking_token_budget)
            stream = await self.start(rid, ids, params, plan, self.check_model(req.model))
        end_id = reply.reasoning.token_ids(self.engine.tokenizer)[1] if reply.reasoning \
            else None
        conversation = history[1:] if req.instructions else history
        return Admitted(stream, rid, len(ids), num_top, reply, end_id, conversation)

    async def _answer(self, req: ResponsesRequest) -> dict:
        """The whole `response` object (cancelled, it aborts the request)."""
        admitted = await self._admit(req)
        try:
            out = await self.last(admitted.stream)
        finally:
            admitted.stream.abort()
        self.check_output(out)
        completion = out.outputs[0]
        token_ids = list(completion.token_ids)
        thinking = admitted.reasoning_tokens(completion.text, token_ids, True)
        logprobs = self.logprobs(completion, admitted.num_top)
        status = _status(completion.finish_reason)
        items = output_items(admitted.reply, completion.text, completion.finish_reason, status,
                             logprobs and logprobs[thinking:])
        return self.final(req, admitted, status, items, len(token_ids), thinking)

    def logprobs(self, completion: CompletionOutput, num_top: int | None) -> list | None:
        """The output_text logprobs of completion's tokens (None when not asked for); tokens as
        "token_id:{id}" under --return-tokens-as-token-ids."""
        if num_top is None or completion.logprobs is None:
            return None
        as_ids = self.cfg.return_tokens_as_token_ids
        return chat_logprobs(completion.token_ids, completion.logprobs, num_top,
                             as_ids)["content"]

    def final(self, req: ResponsesRequest, admitted: Admitted, status: str, items: list,
              output_tokens: int, reasoning_tokens: int) -> dict:
        """The finished `response` object holding items, kept unless req.store is false."""
        body = response_object(req, admitted.rid, self.reply_model(req.model), admitted.created,
                               status=status, output=items,
                               usage=response_usage(admitted.prompt_len, output_tokens,
                                                    reasoning_tokens))
        if req.store is not False:
            self.store.put(admitted.rid, body,
                           [*admitted.conversation, *output_messages(items)])
        return body


def _status(finish_reason: str | None) -> str:
    """A response cut by the token budget is "incomplete"; any other end "completed"."""
    return "incomplete" if finish_reason == "length" else "completed"


# what the sampling fields and the engine call a field -> what /v1/responses calls it
_RESPONSES_NAMES = {"response_format": "text.format", "structured_outputs": "text.format",
                    "logprobs": "top_logprobs", "max_tokens": "max_output_tokens"}
