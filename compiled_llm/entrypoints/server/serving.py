"""What the API handlers share: the model name check, the chat template and tokenization
(both off the event loop and the engine thread, both bounded; a pooling app's too), tools and
reasoning resolved against the server's flags, admission (a 4xx before anything streams), and
the final output."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.chat_utils import conversation, render, resolved_format
from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
from compiled_llm.entrypoints.reasoning_parsers.families import GptOssReasoningParser
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.protocol import ChatMessage
from compiled_llm.entrypoints.server.reply import ReplyFormat
from compiled_llm.entrypoints.server.server_config import ServerConfig
from compiled_llm.entrypoints.server.tool_calls import ToolPlan, history_message, plan_tools
from compiled_llm.entrypoints.server.tracing import request_tracer
from compiled_llm.entrypoints.server.unsupported import refuse_non_text_parts
from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from compiled_llm.entrypoints.tool_parsers.harmony import HarmonyToolParser
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.parallel_config import shown_model_name
from compiled_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from compiled_llm.entrypoints.async_pooling import PoolingTokens

logger = logging.getLogger(__name__)


def harmony_default(engine) -> str | None:
    """"openai_gptoss" for a gpt-oss model (vLLM reads its harmony channels whatever the
    flags say), else None: no reasoning parser unless --reasoning-parser names one."""
    config = getattr(getattr(engine, "model_config", None), "hf_config", None)
    return "openai_gptoss" if getattr(config, "model_type", None) == "gpt_oss" else None


class TokenServing:
    """What every app's handlers share, a pooling app's too: the engine handle (an AsyncLLM,
    or a pooling app's PoolingTokens: each has tokenizer, max_model_len, max_prompt_bytes,
    encode and decode), the server config, the model name check and tokenization."""

    def __init__(self, engine: AsyncLLM | PoolingTokens, cfg: ServerConfig) -> None:
        self.engine, self.cfg = engine, cfg
        self.model_name = cfg.model_name
        self.max_model_len = engine.max_model_len
        self.loras = None  # the served LoRA adapters (lora_routes.ServedLoRAs), set by the app

    def check_model(self, name: str | None):
        """The LoRARequest of the adapter served as name, None for the base model (no name,
        or any of its served names); 404 for any other name."""
        if name is None or name in self.cfg.model_names:
            return None
        lora = None if self.loras is None else self.loras.get(name)
        if lora is None:
            served = ", ".join(repr(served) for served in self.cfg.model_names)
            raise OpenAIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{served}", param="model", code="model_not_found")
        return lora

    def tokens_as_ids(self, req) -> bool:
        """Whether req's logprobs show tokens as "token_id:{id}": its own
        return_tokens_as_token_ids where it gives one, else the server's
        (--return-tokens-as-token-ids)."""
        own = getattr(req, "return_tokens_as_token_ids", None)
        return self.cfg.return_tokens_as_token_ids if own is None else own

    async def encode(self, text: str, add_special_tokens: bool = True,
                     name: str = "prompt") -> list[int]:
        """Token ids of text, on the tokenizer's thread; a 400 naming `name` for text over
        the engine's max_prompt_bytes (before tokenizing) or not valid UTF-8."""
        return await self.engine.encode_text(text, name, add_special_tokens=add_special_tokens)

    async def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          kwargs: dict | None = None, tools: list | None = None,
                          chat_template: str | None = None, *,
                          continue_final_message: bool = False) -> str:
        """The chat template applied to messages, rendered in a worker thread under the
        server's time limit; a 400 when it fails, runs too long or renders too much, and for
        a template sent with the request unless trust_request_chat_template is set.
        continue_final_message: the text ends inside the last message (as vLLM and HF)."""
        refuse_non_text_parts(messages)
        kwargs = dict(kwargs or {})  # vLLM updates the template call with them: they win
        add_generation_prompt = kwargs.pop("add_generation_prompt", add_generation_prompt)
        continue_final_message = kwargs.pop("continue_final_message", continue_final_message)
        tools = kwargs.pop("tools", tools)
        if continue_final_message and add_generation_prompt:
            raise OpenAIError(400, "continue_final_message and add_generation_prompt cannot "
                              "both be true", param="continue_final_message")
        chat_template = chat_template if chat_template is not None else kwargs.pop(
            "chat_template", None)
        if chat_template is not None and not self.cfg.trust_request_chat_template:
            raise OpenAIError(400, "chat_template: this server refuses chat templates sent with "
                              "a request (trust_request_chat_template is off)",
                              param="chat_template", code="untrusted_chat_template")
        convo = conversation([history_message(i, m.template_input())
                              for i, m in enumerate(messages)])
        if resolved_format(self.engine.tokenizer, chat_template,
                           self.cfg.chat_template_content_format) == "openai":
            convo = [{**msg, "content": message.text_parts()}
                     for msg, message in zip(convo, messages, strict=True)]
        return await asyncio.to_thread(
            render, self.engine.tokenizer, convo, add_generation_prompt=add_generation_prompt,
            tools=tools, template_kwargs=kwargs, chat_template=chat_template,
            timeout_s=self.cfg.chat_template_timeout_s, max_chars=self.engine.max_prompt_bytes,
            continue_final_message=continue_final_message)

    async def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          kwargs: dict | None = None, tools: list | None = None,
                          chat_template: str | None = None, *,
                          continue_final_message: bool = False,
                          add_special_tokens: bool = False) -> list[int]:
        """Token ids of the rendered chat (the template writes its special tokens; the
        tokenizer's, a BOS, only with add_special_tokens, vLLM's field)."""
        text = await self.render_chat(messages, add_generation_prompt, kwargs, tools,
                                      chat_template,
                                      continue_final_message=continue_final_message)
        return await self.encode(text, add_special_tokens=add_special_tokens, name="messages")


class Serving(TokenServing):
    """Base of the generating API handlers: TokenServing, the metrics, the sampling defaults
    and the tracer."""

    def __init__(self, engine: AsyncLLM, cfg: ServerConfig, metrics: ServerMetrics) -> None:
        super().__init__(engine, cfg)
        self.metrics = metrics
        # vLLM's ModelCard.root of the base model: the model as --model named it
        args = getattr(getattr(engine, "engine", None), "args", None)
        model = getattr(args, "model", None)
        self.model_path = str(shown_model_name(model) or cfg.model_name)
        # the model's generation config (none for pooling): the sampling fields a request
        # leaves unset, and output_budget's default and cap
        self.sampling_defaults = dict(getattr(engine, "sampling_defaults", {}))
        self.budget_limits = {"default": self.sampling_defaults.pop("max_tokens", None),
                              "cap": getattr(engine, "max_tokens_cap", None)}
        self.tracer = request_tracer(cfg.otlp_traces_endpoint, cfg.model_name)

    def cached_tokens(self, outputs: list[RequestOutput]) -> int | None:
        """The prompt tokens these outputs' requests found in the prefix cache, where
        --enable-prompt-tokens-details asks for them (else None: no details)."""
        if not self.cfg.enable_prompt_tokens_details:
            return None
        return sum(out.num_cached_tokens for out in outputs)

    def reply_model(self, name: str | None) -> str:
        """The `model` a reply carries, as vLLM's: the adapter's name when name selects a
        served LoRA adapter, else the served model's name."""
        lora = None if self.loras is None or name is None else self.loras.get(name)
        return self.model_name if lora is None else lora.lora_name

    def tool_plan(self, tools: list | None, tool_choice, parallel_tool_calls: bool | None
                  ) -> ToolPlan:
        """Chat-shaped tools and tool_choice resolved against the server's parser flags."""
        parser = self.cfg.tool_call_parser
        return plan_tools(tools, tool_choice, parallel_tool_calls,
                          parser and get_tool_parser(parser), self.cfg.enable_auto_tool_choice)

    def reply_format(self, plan: ToolPlan, prompt_ids: list[int],
                     template_kwargs: dict | None = None) -> ReplyFormat:
        """How the replies to prompt_ids (rendered with template_kwargs) are read: plan, and
        the server's reasoning parser."""
        name = self.cfg.reasoning_parser or harmony_default(self.engine)
        if name is None:
            return ReplyFormat(plan)
        parser = get_reasoning_parser(name).for_prompt(prompt_ids, self.engine.tokenizer,
                                                       template_kwargs)
        if isinstance(parser, GptOssReasoningParser):  # the calls go to the harmony parser
            parser.keep_calls = isinstance(plan.parser, HarmonyToolParser)
        return ReplyFormat(plan, parser, end_id=parser.end_ids(self.engine.tokenizer))

    async def start(self, rid: str, ids: list[int], params: SamplingParams,
                    plan: ToolPlan | None = None, lora_request=None, *, priority: int = 0,
                    cache_salt: str | None = None):
        """Admit a request; its stream of outputs, or a ValueError (a 400) with nothing
        queued (counted as rejected once, by the route). Traced, its span starts now. A
        tool grammar (plan's) that does not compile is a 400 on tools. priority and
        cache_salt are the request's (vLLM's fields), checked by the engine."""
        started_ns = time.time_ns()
        if self.cfg.enable_log_requests:  # vLLM's: at most max_log_len ids shown
            logger.info("Received request %s: prompt_token_ids: %s, params: %s, lora_request: "
                        "%s.", rid, ids[:self.cfg.max_log_len], params, lora_request)
        prompt = {"prompt_token_ids": ids}
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        try:
            stream = await self.engine.add_request(rid, prompt, params,
                                                   lora_request=lora_request, priority=priority)
        except ValueError as exc:
            if plan is None or plan.grammar() is None or \
                    not str(exc).startswith("structured_outputs"):
                raise
            raise OpenAIError(400, f"tools: the parameters do not compile to a grammar: {exc}",
                              param="tools") from None
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


def request_ids(prefix: str, req, raw) -> tuple[str, str]:
    """(the reply's id, the engine's request id): vLLM's `{prefix}-{request_id}` where the
    client named the request (its `request_id` field, else an X-Request-Id header); the engine's
    id then gains a random suffix, so two clients' equal names never meet in the engine."""
    named = req.request_id or raw.headers.get("x-request-id")
    if not named:
        rid = f"{prefix}-{uuid.uuid4().hex}"
        return rid, rid
    return f"{prefix}-{named}", f"{prefix}-{named}-{uuid.uuid4().hex[:8]}"
