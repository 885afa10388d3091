"""/v1/completions: one engine request per prompt (n choices each; choice index is
prompt_index * n + j), streamed as `text_completion` events or returned in one body."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.params import output_budget, sampling_params, truncated_prompt
from compiled_llm.entrypoints.server.protocol import CompletionRequest
from compiled_llm.entrypoints.server.serving import Serving, request_ids
from compiled_llm.entrypoints.server.streaming import (
    DONE,
    abort_on_disconnect,
    choice_events,
    completion_logprobs,
    merge_streams,
    prompt_logprobs_json,
    sse,
    stream_usage,
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
            admitted = await abort_on_disconnect(raw, self._admit(req, raw))
            return StreamingResponse(self._chunks(req, *admitted),
                                     media_type="text/event-stream")
        return JSONResponse(await abort_on_disconnect(raw, self._answer(req, raw)))

    async def _admit(self, req: CompletionRequest, raw: Request) -> tuple[list, str, list]:
        """(streams, id, prompts): every prompt tokenized and admitted, or none (a failure
        or a cancel aborts those already admitted). Echoing with max_tokens 0 generates one
        token and shows none, as vLLM does; echoing with logprobs scores the prompt."""
        texts = self._texts(req.prompt)
        encoded = await self._prompts(texts, req.add_special_tokens)
        prompts = [truncated_prompt(req, ids, self.max_model_len, self.engine.tokenizer,
                                    t if isinstance(t, str) else None)
                   for t, ids in zip(texts, encoded)]
        # a truncated prompt echoes as its kept tokens decode
        texts = [t if len(p) == len(e) else p for t, p, e in zip(texts, prompts, encoded)]
        max_tokens = 1 if req.echo and req.max_tokens == 0 else req.max_tokens
        params = [sampling_params(req, output_budget(max_tokens, len(p), self.max_model_len,
                                                     prompt_param="prompt",
                                                     **self.budget_limits),
                                  req.logprobs, req.stream,
                                  prompt_logprobs=req.logprobs if req.echo else None,
                                  defaults=self.sampling_defaults)
                  for p in prompts]
        (rid, engine_id), lora = request_ids("cmpl", req, raw), self.check_model(req.model)
        streams = []
        try:
            for i, (ids, prompt_params) in enumerate(zip(prompts, params)):
                streams.append(await self.start(f"{engine_id}-{i}", ids, prompt_params,
                                                lora_request=lora, priority=req.priority,
                                                cache_salt=req.cache_salt))
            shown = [await self._shown(ids, text, req.echo) for ids, text in zip(prompts, texts)]
        except BaseException:
            for stream in streams:
                stream.abort()
            raise
        return streams, rid, shown

    async def _shown(self, ids: list[int], text: str | list[int], echo: bool) -> _Prompt:
        """An echoed text prompt shows as sent (as vLLM's does), token ids as decoded."""
        if not echo:
            return _Prompt(ids)
        shown = text if isinstance(text, str) else await self.engine.decode(ids)
        return _Prompt(ids, shown, await self.engine.decode(ids[:1]))

    async def _answer(self, req: CompletionRequest, raw: Request) -> dict:
        """The whole JSON body (cancelled, it aborts every prompt's request)."""
        streams, rid, prompts = await self._admit(req, raw)
        return await self._collect(streams, rid, req, prompts)

    @staticmethod
    def _check_unsupported(req: CompletionRequest) -> None:
        if req.suffix is not None:
            raise OpenAIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError(400, "best_of must equal n (no beam search)", param="best_of")
        if req.max_tokens == 0 and not req.echo:
            raise OpenAIError(400, "max_tokens must be >= 1, got 0 (0 only with echo=true)",
                              param="max_tokens", code="invalid_value")

    def _texts(self, prompt) -> list:
        """The request's prompts, one per entry: a str or a list of token ids."""
        if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        limit = self.cfg.max_completion_prompts
        if len(prompt) > limit:
            raise OpenAIError(400, f"prompt is a list of {len(prompt)} prompts; at most {limit} "
                              "(max_completion_prompts)", param="prompt")
        return prompt

    async def _prompts(self, texts: list, add_special_tokens: bool) -> list[list[int]]:
        return [p if isinstance(p, list) else await self.encode(p, add_special_tokens)
                for p in texts]

    def _choice(self, prompt_index: int, completion: CompletionOutput, req: CompletionRequest,
                prompt: _Prompt, prompt_logprobs: list | None, first: bool,
                offset: int) -> tuple[dict, int]:
        """(choice, tokens generated in it): the echoed prompt leads a choice's first piece;
        with max_tokens 0 the one token generated is not shown. With return_token_ids (as
        vLLM) the choice carries its token_ids, its first piece the prompt_token_ids, and an
        echo shows the prompt by those ids only, not as text."""
        shown = req.max_tokens != 0
        text = completion.text if shown else ""
        ids = completion.token_ids if shown else []
        entries = (completion.logprobs or []) if shown else []
        if first and req.echo:
            text = ("" if req.return_token_ids else prompt.text) + text
            ids = prompt.token_ids + ids
            entries = (prompt_logprobs or [None] * len(prompt.token_ids)) + entries
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(ids, entries, req.logprobs, offset,
                                           unscored=prompt.first_token,
                                           as_ids=self.tokens_as_ids(req))
        choice = {"index": prompt_index * req.n + completion.index, "text": text,
                  "logprobs": logprobs, "finish_reason": completion.finish_reason,
                  "stop_reason": completion.stop_reason}
        if req.return_token_ids:
            choice["prompt_token_ids"] = list(prompt.token_ids) if first else None
            choice["token_ids"] = list(completion.token_ids) if shown else []
        return choice, len(completion.token_ids) if shown else 0

    async def _collect(self, streams, rid: str, req: CompletionRequest, prompts) -> dict:
        """Read every stream to its end into one body."""
        choices, gen, lasts = [], 0, {}
        async for i, out in merge_streams(streams):
            self.check_output(out)
            lasts[i] = out
            for completion in out.outputs:
                choice, tokens = self._choice(i, completion, req, prompts[i],
                                              out.prompt_logprobs, True, 0)
                choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
                choices.append(choice)
                gen += tokens
        choices.sort(key=lambda choice: choice["index"])
        return {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": self.reply_model(req.model), "choices": choices,
                "usage": usage(sum(len(p.token_ids) for p in prompts), gen,
                               self.cached_tokens(list(lasts.values())))}

    async def _chunks(self, req: CompletionRequest, streams, rid: str,
                      prompts) -> AsyncIterator[str]:
        created, offsets, counts, lasts = int(time.time()), {}, {}, {}
        final_usage, continuous = stream_usage(req.stream_options,
                                               self.cfg.enable_force_include_usage)

        chunk = choice_events({"id": rid, "object": "text_completion", "created": created,
                               "model": self.reply_model(req.model)})

        try:
            async for i, out in merge_streams(streams):
                self.check_output(out)
                lasts[i] = out
                for completion in out.outputs:
                    index = i * req.n + completion.index
                    choice, tokens = self._choice(i, completion, req, prompts[i],
                                                  out.prompt_logprobs, index not in offsets,
                                                  offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + len(choice["text"])
                    counts[index] = counts.get(index, 0) + tokens
                    extra = {}
                    if continuous:
                        extra["usage"] = usage(len(prompts[i].token_ids), counts[index])
                    yield chunk([choice], **extra)
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:
            for stream in streams:
                stream.abort()
        if final_usage:
            yield chunk([], usage=usage(sum(len(p.token_ids) for p in prompts),
                                        sum(counts.values()),
                                        self.cached_tokens(list(lasts.values()))))
        yield DONE


@dataclass
class _Prompt:
    """One prompt as its choices show it: its ids and, when echoed, its text and the text of
    its first token (which has no logprob)."""

    token_ids: list[int]
    text: str = ""
    first_token: str = ""
