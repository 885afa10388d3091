"""What the completion and chat handlers share: the model name check, tokenization on the
engine thread, admission (a 4xx before anything streams), and the final output."""

from __future__ import annotations

import functools

from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.protocol import ChatMessage
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import SamplingParams


class Serving:
    """Base of the API handlers: owns the engine handle, the served name and the metrics."""

    def __init__(self, engine: AsyncLLM, model_name: str, metrics: ServerMetrics) -> None:
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.max_model_len = engine.max_model_len

    def check_model(self, name: str | None) -> None:
        """404 unless name is None or the served model's name."""
        if name is not None and name != self.model_name:
            raise OpenAIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{self.model_name!r}", param="model", code="model_not_found")

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; the tokenizer is only ever used on the engine thread."""
        tok = self.engine.tokenizer
        return await self.engine.call(
            functools.partial(tok.encode, text, add_special_tokens=add_special_tokens))

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                    kwargs: dict | None = None, tools: list | None = None) -> str:
        """The chat template applied to messages, as text; 400 when the template fails."""
        convo = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                 for m in messages]
        try:
            return self.engine.tokenizer.apply_chat_template(
                convo, tokenize=False, add_generation_prompt=add_generation_prompt,
                tools=tools, **(kwargs or {}))
        except Exception as exc:  # template errors (jinja raise_exception, bad roles)
            raise OpenAIError(400, f"messages: the chat template failed: {exc}",
                              param="messages") from None

    async def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          kwargs: dict | None = None, tools: list | None = None) -> list[int]:
        """Token ids of the rendered chat (the template adds any special tokens itself)."""
        text = self.render_chat(messages, add_generation_prompt, kwargs, tools)
        return await self.encode(text, add_special_tokens=False)

    async def start(self, rid: str, ids: list[int], params: SamplingParams):
        """Admit a request; its stream of outputs, or a 400 with nothing queued."""
        try:
            return await self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        except ValueError:
            self.metrics.rejected()
            raise

    @staticmethod
    async def last(stream) -> RequestOutput:
        """The final output of a stream (read to its end)."""
        final = None
        async for out in stream:
            final = out
        return final

    @staticmethod
    def check_output(out: RequestOutput) -> None:
        """500 when the request finished with an error."""
        if out.error:
            raise OpenAIError(500, f"generation failed: {out.error}", code="generation_error")
