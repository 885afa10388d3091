"""/v1/chat/completions: chat template, one engine request with n choices, streamed as
`chat.completion.chunk` events or returned as one `chat.completion`."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.params import output_budget, sampling_params
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.streaming import (
    DONE,
    abort_on_disconnect,
    chat_logprobs,
    choice_events,
    sse,
    usage,
)
from compiled_llm.output.outputs import CompletionOutput, RequestOutput


class ServingChat(Serving):
    """The /v1/chat/completions handler."""

    async def create(self, req: ChatCompletionRequest, raw: Request):
        """Answer one chat request: a JSON body, or an event stream when req.stream. A client
        that leaves aborts the request, admitted or not yet."""
        self.check_model(req.model)
        if not req.messages:
            raise OpenAIError(400, "messages must be a non-empty list", param="messages")
        if req.stream:
            admitted = await abort_on_disconnect(raw, self._admit(req))
            return StreamingResponse(self._chunks(req, *admitted), media_type="text/event-stream")
        return JSONResponse(await abort_on_disconnect(raw, self._answer(req)))

    async def _admit(self, req: ChatCompletionRequest) -> tuple:
        """(stream, id, prompt length, top logprobs): the chat rendered, tokenized, admitted."""
        ids = await self.encode_chat(req.messages, req.add_generation_prompt,
                                     req.chat_template_kwargs, req.tools, req.chat_template)
        # max_completion_tokens: 0 is a value (refused), not "unset"
        budget_param = "max_tokens" if req.max_completion_tokens is None else \
            "max_completion_tokens"
        requested = getattr(req, budget_param)
        num_top = (req.top_logprobs or 0) if req.logprobs else None
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        budget = output_budget(requested, len(ids), self.max_model_len, budget_param=budget_param)
        params = sampling_params(req, budget, num_top, req.stream)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        return await self.start(rid, ids, params), rid, len(ids), num_top

    async def _answer(self, req: ChatCompletionRequest) -> dict:
        """The whole JSON body (cancelled, it aborts the request)."""
        stream, rid, _, num_top = await self._admit(req)
        try:
            return self._response(await self.last(stream), rid, num_top)
        finally:
            stream.abort()

    def _response(self, out: RequestOutput, rid: str, num_top: int | None) -> dict:
        self.check_output(out)
        choices = [{"index": o.index, "message": {"role": "assistant", "content": o.text},
                    "logprobs": self._logprobs(o, num_top), "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason} for o in out.outputs]
        gen = sum(len(o.token_ids) for o in out.outputs)
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": usage(len(out.prompt_token_ids), gen)}

    @staticmethod
    def _logprobs(completion: CompletionOutput, num_top: int | None) -> dict | None:
        if num_top is None or completion.logprobs is None:
            return None
        return chat_logprobs(completion.token_ids, completion.logprobs, num_top)

    async def _chunks(self, req: ChatCompletionRequest, stream, rid: str, prompt_len: int,
                      num_top: int | None) -> AsyncIterator[str]:
        created = int(time.time())
        fields = {"id": rid, "object": "chat.completion.chunk", "created": created,
                  "model": self.model_name}
        chunk = choice_events(fields)

        gen = 0
        try:
            for i in range(req.n):  # the role comes first, before any token
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}])
            async for out in stream:
                self.check_output(out)
                for completion in out.outputs:
                    gen += len(completion.token_ids)
                    delta = {"content": completion.text} if completion.text else {}
                    yield chunk([{"index": completion.index, "delta": delta,
                                  "logprobs": self._logprobs(completion, num_top),
                                  "finish_reason": completion.finish_reason}])
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:  # a client gone mid-stream closes us: free its blocks now
            stream.abort()
        if req.stream_options and req.stream_options.include_usage:
            yield sse({**fields, "choices": [], "usage": usage(prompt_len, gen)})
        yield DONE
