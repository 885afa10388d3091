"""/v1/completions: one engine request per prompt (n choices each; choice index is
prompt_index * n + j), streamed as `text_completion` events or returned in one body."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.params import output_budget, sampling_params
from compiled_llm.entrypoints.server.protocol import CompletionRequest
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.streaming import (
    DONE,
    abort_on_disconnect,
    choice_events,
    completion_logprobs,
    merge_streams,
    sse,
    usage,
)
from compiled_llm.output.outputs import CompletionOutput


class ServingCompletion(Serving):
    """The /v1/completions handler."""

    async def create(self, req: CompletionRequest, raw: Request):
        """Answer one completions request: a JSON body, or an event stream when req.stream.
        A client that leaves aborts every prompt's request, admitted or not yet."""
        self.check_model(req.model)
        self._check_unsupported(req)
        if req.stream:
            admitted = await abort_on_disconnect(raw, self._admit(req))
            return StreamingResponse(self._chunks(req, *admitted),
                                     media_type="text/event-stream")
        return JSONResponse(await abort_on_disconnect(raw, self._answer(req)))

    async def _admit(self, req: CompletionRequest) -> tuple[list, str, list, list]:
        """(streams, id, prompts, echo texts): every prompt tokenized and admitted, or none
        (a failure or a cancel aborts those already admitted)."""
        prompts = await self._prompts(req.prompt)
        params = [sampling_params(req, output_budget(req.max_tokens, len(p), self.max_model_len,
                                                     prompt_param="prompt"),
                                  req.logprobs, req.stream) for p in prompts]
        rid = f"cmpl-{uuid.uuid4().hex}"
        streams = []
        try:
            for i, (ids, prompt_params) in enumerate(zip(prompts, params)):
                streams.append(await self.start(f"{rid}-{i}", ids, prompt_params))
            echo = [await self.engine.decode(p) if req.echo else "" for p in prompts]
        except BaseException:
            for stream in streams:
                stream.abort()
            raise
        return streams, rid, prompts, echo

    async def _answer(self, req: CompletionRequest) -> dict:
        """The whole JSON body (cancelled, it aborts every prompt's request)."""
        streams, rid, prompts, echo = await self._admit(req)
        return await self._collect(streams, rid, req, prompts, echo)

    @staticmethod
    def _check_unsupported(req: CompletionRequest) -> None:
        if req.suffix is not None:
            raise OpenAIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError(400, "best_of must equal n (no beam search)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs is not supported", param="echo")

    async def _prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        limit = self.cfg.max_completion_prompts
        if len(prompt) > limit:
            raise OpenAIError(400, f"prompt is a list of {len(prompt)} prompts; at most {limit} "
                              "(max_completion_prompts)", param="prompt")
        return [p if isinstance(p, list) else await self.encode(p) for p in prompt]

    def _choice(self, prompt_index: int, completion: CompletionOutput, req: CompletionRequest,
                text: str, offset: int) -> dict:
        logprobs = None
        if req.logprobs is not None and completion.logprobs is not None:
            logprobs = completion_logprobs(completion.token_ids, completion.logprobs,
                                           req.logprobs, offset)
        return {"index": prompt_index * req.n + completion.index, "text": text,
                "logprobs": logprobs, "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason}

    async def _collect(self, streams, rid: str, req: CompletionRequest, prompts, echo) -> dict:
        """Read every stream to its end into one body."""
        choices, gen = [], 0
        async for i, out in merge_streams(streams):
            self.check_output(out)
            for completion in out.outputs:
                gen += len(completion.token_ids)
                choices.append(self._choice(i, completion, req, echo[i] + completion.text, 0))
        choices.sort(key=lambda choice: choice["index"])
        return {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": usage(sum(map(len, prompts)), gen)}

    async def _chunks(self, req: CompletionRequest, streams, rid: str, prompts,
                      echo) -> AsyncIterator[str]:
        created, gen = int(time.time()), 0
        offsets: dict[int, int] = {}
        event = choice_events({"id": rid, "object": "text_completion", "created": created,
                               "model": self.model_name})
        try:
            async for i, out in merge_streams(streams):
                self.check_output(out)
                for completion in out.outputs:
                    index = i * req.n + completion.index
                    text = completion.text if index in offsets else echo[i] + completion.text
                    choice = self._choice(i, completion, req, text, offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + len(text)
                    gen += len(completion.token_ids)
                    yield event([choice])
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:
            for stream in streams:
                stream.abort()
        if req.stream_options and req.stream_options.include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": created,
                       "model": self.model_name, "choices": [],
                       "usage": usage(sum(map(len, prompts)), gen)})
        yield DONE
