"""What the completion and chat handlers share: the model name check, the chat template and
tokenization (both off the event loop and the engine thread, both bounded), admission (a 4xx
before anything streams), and the final output."""

from __future__ import annotations

import asyncio
import time

from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.chat_utils import conversation, render
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.protocol import ChatMessage
from compiled_llm.entrypoints.server.server_config import ServerConfig
from compiled_llm.entrypoints.server.tool_calls import history_message
from compiled_llm.entrypoints.server.tracing import request_tracer
from compiled_llm.entrypoints.server.unsupported import refuse_non_text_parts
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import SamplingParams


class Serving:
    """Base of the API handlers: owns the engine handle, the server config and the metrics."""

    def __init__(self, engine: AsyncLLM, cfg: ServerConfig, metrics: ServerMetrics) -> None:
        self.engine, self.cfg, self.metrics = engine, cfg, metrics
        self.model_name = cfg.model_name
        self.max_model_len = engine.max_model_len
        self.tracer = request_tracer(cfg.otlp_traces_endpoint, cfg.model_name)

    def check_model(self, name: str | None) -> None:
        """404 unless name is None or the served model's name."""
        if name is not None and name != self.model_name:
            raise OpenAIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{self.model_name!r}", param="model", code="model_not_found")

    async def encode(self, text: str, add_special_tokens: bool = True,
                     name: str = "prompt") -> list[int]:
        """Token ids of text, on the tokenizer's thread; a 400 naming `name` for text over
        the engine's max_prompt_bytes (before tokenizing) or not valid UTF-8."""
        return await self.engine.encode(text, name, add_special_tokens=add_special_tokens)

    async def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          kwargs: dict | None = None, tools: list | None = None,
                          chat_template: str | None = None) -> str:
        """The chat template applied to messages, rendered in a worker thread under the
        server's time limit; a 400 when it fails, runs too long or renders too much, and for
        a template sent with the request unless trust_request_chat_template is set."""
        refuse_non_text_parts(messages)
        kwargs = dict(kwargs or {})
        chat_template = chat_template if chat_template is not None else kwargs.pop(
            "chat_template", None)
        if chat_template is not None and not self.cfg.trust_request_chat_template:
            raise OpenAIError(400, "chat_template: this server refuses chat templates sent with "
                              "a request (trust_request_chat_template is off)",
                              param="chat_template", code="untrusted_chat_template")
        convo = conversation([history_message(i, m.template_input())
                              for i, m in enumerate(messages)])
        return await asyncio.to_thread(
            render, self.engine.tokenizer, convo, add_generation_prompt=add_generation_prompt,
            tools=tools, template_kwargs=kwargs, chat_template=chat_template,
            timeout_s=self.cfg.chat_template_timeout_s, max_chars=self.engine.max_prompt_bytes)

    async def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          kwargs: dict | None = None, tools: list | None = None,
                          chat_template: str | None = None) -> list[int]:
        """Token ids of the rendered chat (the template adds any special tokens itself)."""
        text = await self.render_chat(messages, add_generation_prompt, kwargs, tools,
                                      chat_template)
        return await self.encode(text, add_special_tokens=False, name="messages")

    async def start(self, rid: str, ids: list[int], params: SamplingParams):
        """Admit a request; its stream of outputs, or a ValueError (a 400) with nothing
        queued (counted as rejected once, by the route). Traced, its span starts now."""
        started_ns = time.time_ns()
        stream = await self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        if self.tracer is None:
            return stream
        return self.tracer.traced(stream, rid, params, started_ns)

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
