"""/v1/chat/completions: chat template (with the request's tools), one engine request with n
choices, each reply read for reasoning and tool calls (reply.py), streamed as
`chat.completion.chunk` events or returned as one `chat.completion`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.chat_utils import with_reasoning_effort
from compiled_llm.entrypoints.server.errors import OpenAIError, renamed_params
from compiled_llm.entrypoints.server.params import output_budget, sampling_params, truncated_prompt
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest
from compiled_llm.entrypoints.server.reply import ReplyFormat, reply_params
from compiled_llm.entrypoints.server.serving import Serving, request_ids
from compiled_llm.entrypoints.server.streaming import (
    DONE,
    abort_on_disconnect,
    chat_logprobs,
    choice_events,
    prompt_logprobs_json,
    sse,
    stream_usage,
    usage,
)
from compiled_llm.output.outputs import CompletionOutput, RequestOutput


def with_documents(kwargs: dict | None, req: ChatCompletionRequest) -> dict | None:
    """Template kwargs with the request's `documents` (vLLM's field, for RAG templates)
    unless chat_template_kwargs set them (those win, as vLLM updates with them)."""
    documents = (req.model_extra or {}).get("documents")
    return kwargs if documents is None else {"documents": documents, **(kwargs or {})}

class ServingChat(Serving):
    """The /v1/chat/completions handler."""

    async def create(self, req: ChatCompletionRequest, raw: Request):
        """Answer one chat request: a JSON body, or an event stream when req.stream. A client
        that leaves aborts the request, admitted or not yet."""
        self.check_model(req.model)
        if not req.messages:
            raise OpenAIError(400, "messages must be a non-empty list", param="messages")
        if req.stream:
            admitted = await abort_on_disconnect(raw, self._admit(req, raw))
            return StreamingResponse(self._chunks(req, *admitted), media_type="text/event-stream")
        return JSONResponse(await abort_on_disconnect(raw, self._answer(req, raw)))

    async def _admit(self, req: ChatCompletionRequest, raw: Request) -> tuple:
        """(stream, id, prompt length, top logprobs, reply format): the chat rendered with
        its tools, tokenized, admitted."""
        plan = self.tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls)
        kwargs = with_documents(with_reasoning_effort(req.chat_template_kwargs,
                                                      req.reasoning_effort), req)
        ids = await self.encode_chat(req.messages, req.add_generation_prompt, kwargs,
                                     plan.tools, req.chat_template,
                                     continue_final_message=req.continue_final_message,
                                     add_special_tokens=req.add_special_tokens)
        ids = truncated_prompt(req, ids, self.max_model_len)
        # max_completion_tokens: 0 is a value (refused), not "unset"
        budget_param = "max_tokens" if req.max_completion_tokens is None else \
            "max_completion_tokens"
        requested = getattr(req, budget_param)
        num_top = (req.top_logprobs or 0) if req.logprobs else None
        if req.top_logprobs not in (None, 0) and not req.logprobs:  # vLLM's: 0 asks nothing
            raise OpenAIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        budget = output_budget(requested, len(ids), self.max_model_len, budget_param=budget_param,
                               **self.budget_limits)
        reply = self.reply_format(plan, ids, kwargs)
        reply.include_reasoning = req.include_reasoning
        rid, engine_id = request_ids("chatcmpl", req, raw)
        with renamed_params({"logprobs": "top_logprobs"}):  # the engine's name for the count
            params = reply_params(sampling_params(req, budget, num_top, req.stream,
                                                 defaults=self.sampling_defaults), reply,
                                  self.engine.tokenizer, req.thinking_token_budget)
            stream = await self.start(engine_id, ids, params, plan, self.check_model(req.model),
                                      priority=req.priority, cache_salt=req.cache_salt)
        return stream, rid, ids, num_top, reply

    async def _answer(self, req: ChatCompletionRequest, raw: Request) -> dict:
        """The whole JSON body (cancelled, it aborts the request)."""
        stream, rid, _, num_top, reply = await self._admit(req, raw)
        try:
            role = reply_role(req, self.cfg.response_role)
            return self._response(await self.last(stream), rid, req, num_top, reply,
                                  echoed(req, role), role)
        finally:
            stream.abort()

    def _response(self, out: RequestOutput, rid: str, req: ChatCompletionRequest,
                  num_top: int | None, reply: ReplyFormat, echo: str | None, role: str) -> dict:
        self.check_output(out)
        as_ids = self.tokens_as_ids(req)
        choices = []
        for o in out.outputs:
            message, finish_reason = reply.message(o.text, o.finish_reason, role)
            if reply.plan.mode in ("named", "required") and message["content"] is None:
                message["content"] = ""  # vLLM: a forced call's message has "", not null
            if echo is not None:  # as vLLM: the echo leads the content, even an empty one
                message["content"] = echo + (message["content"] or "")
            choices.append({"index": o.index, "message": message,
                            "logprobs": self._logprobs(o, num_top, as_ids),
                            "finish_reason": finish_reason, "stop_reason": o.stop_reason,
                            **_token_ids(req, o)})
        gen = sum(len(o.token_ids) for o in out.outputs)
        thinking = _sum_or_none(reply.reasoning_tokens(o.text, list(o.token_ids))
                                for o in out.outputs)
        body = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": self.reply_model(req.model), "choices": choices,
                "usage": usage(len(out.prompt_token_ids), gen, self.cached_tokens([out]),
                               thinking),
                "prompt_logprobs": prompt_logprobs_json(out.prompt_logprobs)}
        if req.return_token_ids:  # vLLM: the prompt's ids beside the choices
            body["prompt_token_ids"] = list(out.prompt_token_ids)
        return body

    @staticmethod
    def _logprobs(completion: CompletionOutput, num_top: int | None,
                  as_ids: bool = False) -> dict | None:
        if num_top is None or completion.logprobs is None:
            return None
        return chat_logprobs(completion.token_ids, completion.logprobs, num_top, as_ids)

    async def _chunks(self, req: ChatCompletionRequest, stream, rid: str,
                      prompt_ids: list[int], num_top: int | None,
                      reply: ReplyFormat) -> AsyncIterator[str]:
        created, prompt_len = int(time.time()), len(prompt_ids)
        # vLLM's return_token_ids: the prompt's ids on the role chunks, each choice its new ids
        head = {"prompt_token_ids": list(prompt_ids)} if req.return_token_ids else {}
        counts = [0] * req.n
        event = choice_events({"id": rid, "object": "chat.completion.chunk",
                               "created": created, "model": self.reply_model(req.model)})

        # vLLM: usage on every chunk only with include_usage and continuous_usage_stats
        final_usage, continuous = stream_usage(req.stream_options,
                                               self.cfg.enable_force_include_usage)

        def chunk(choices: list, **extra) -> str:
            if continuous and choices:
                extra["usage"] = usage(prompt_len, counts[choices[0]["index"]])
            return event(choices, **extra)

        gen, streamers, last = 0, [reply.streamer() for _ in range(req.n)], None
        role = reply_role(req, self.cfg.response_role)
        echo = echoed(req, role)
        try:
            for i in range(req.n):  # the role comes first, before any token
                yield chunk([{"index": i, "delta": {"role": role, "content": ""},
                              "logprobs": None, "finish_reason": None}], **head)
            for i in range(req.n if echo else 0):  # then the echoed message, if any
                yield chunk([{"index": i, "delta": {"content": echo}, "logprobs": None,
                              "finish_reason": None}])
            async for out in stream:
                self.check_output(out)
                last = out
                for completion in out.outputs:
                    gen += len(completion.token_ids)
                    counts[completion.index] += len(completion.token_ids)
                    streamer, done = streamers[completion.index], completion.finish_reason
                    delta = streamer.feed(completion.text, done is not None,
                                          completion.token_ids)
                    logprobs = self._logprobs(completion, num_top, self.tokens_as_ids(req))
                    if not delta and not reply.parses:
                        delta = {"content": ""}  # vLLM's plain delta: the text, "" too
                    elif (not delta and done is None and logprobs is None
                          and not req.return_token_ids):
                        continue  # a parser holds it all back: vLLM sends no chunk
                    # vLLM: a choice's last chunk names its stop_reason (the stop string or id)
                    ending = {} if done is None else {"stop_reason": completion.stop_reason}
                    yield chunk([{"index": completion.index, "delta": delta,
                                  "logprobs": logprobs,
                                  "finish_reason": streamer.finish_reason(done), **ending,
                                  **_token_ids(req, completion)}])
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:  # a client gone mid-stream closes us: free its blocks now
            stream.abort()
        if final_usage:
            cached = self.cached_tokens([] if last is None else [last])
            thinking = _sum_or_none(s.reasoning_tokens() for s in streamers)
            yield chunk([], usage=usage(prompt_len, gen, cached, thinking))
        yield DONE


def _sum_or_none(counts: Iterable[int | None]) -> int | None:
    """The sum of the choices' reasoning token counts; None where none was counted (no
    reasoning parser: no completion_tokens_details)."""
    counted = [count for count in counts if count is not None]
    return sum(counted) if counted else None


def _token_ids(req: ChatCompletionRequest, completion: CompletionOutput) -> dict:
    """A choice's token_ids (its new ones, in a stream) where return_token_ids asks."""
    return {"token_ids": list(completion.token_ids)} if req.return_token_ids else {}


def reply_role(req: ChatCompletionRequest, response_role: str) -> str:
    """The reply's role, as vLLM's get_chat_request_role: response_role (--response-role)
    after a generation prompt, else the last message's own (the reply continues it)."""
    return response_role if req.add_generation_prompt else req.messages[-1].role


def echoed(req: ChatCompletionRequest, role: str) -> str | None:
    """What vLLM's chat `echo` puts before the reply (None: echo is off): the last message's
    content when its role is the reply's `role`, else ""."""
    if not req.echo:
        return None
    last = req.messages[-1]
    return last.text() if last.role == role else ""
