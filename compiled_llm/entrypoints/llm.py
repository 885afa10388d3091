"""The offline API, shaped like vLLM's: LLM(model=...).generate(...), .chat(...) with vLLM's
template arguments and .beam_search(...); set_tokenizer, sleep / wake_up, collective_rpc,
apply_model and the profiler hooks are refused by name (this engine has none of them)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from itertools import count
from typing import Any

from tqdm.auto import tqdm

from compiled_llm.config import EngineArgs
from compiled_llm.engine.inputs import PromptType
from compiled_llm.engine.llm_engine import DEMO_MODEL, LLMEngine, resolve_device
from compiled_llm.entrypoints.beam_search import BeamSearchOutput, beam_search
from compiled_llm.entrypoints.chat_utils import conversation, render, resolved_format
from compiled_llm.entrypoints.llm_pooling import PoolingMixin, as_prompt_list, check_runner
from compiled_llm.lora.request import LoRARequest
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


class LLM(PoolingMixin):
    """An engine for batch generation (runner="generate") or pooling (runner="pooling": embed,
    classify, score). Keyword arguments are EngineArgs fields. `with LLM(...) as llm:` shuts it
    down on exit; dropping the last reference frees it too."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        from compiled_llm.engine.pooling_engine import PoolingEngine, resolve_runner

        args = EngineArgs(model=model, **kwargs)
        self.runner_type = resolve_runner(args, str(args.model or DEMO_MODEL))
        if self.runner_type == "pooling":
            self.engine = PoolingEngine(args)
        else:
            self.engine = LLMEngine(args, core_process=offline_core_process(args))
        self._ids = count()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Abort what is running and give back the device memory and compiled code the engine
        holds, while `llm` may still be referenced (idempotent); generate raises after."""
        self.engine.shutdown()

    def get_metrics(self) -> list:
        """vLLM v1's metric snapshot: Counter/Gauge/Vector objects with .name and .value
        (engine load, prefix cache and speculative decoding counters)."""
        from compiled_llm.engine.metrics import EngineStats, engine_metrics

        # a pooling engine keeps no load statistics: its snapshot is all zeros
        return engine_metrics(getattr(self.engine, "get_stats", EngineStats)())

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate and chat sample with when given no SamplingParams: the model's
        generation-config defaults (EngineArgs.generation_config), else SamplingParams()."""
        return SamplingParams(**getattr(self.engine, "sampling_defaults", {}))

    @property
    def llm_engine(self) -> LLMEngine | Any:
        """The engine (vLLM's name for it): an LLMEngine, or a PoolingEngine for pooling."""
        return self.engine

    @property
    def model_config(self):
        """The engine's model_config (vLLM's LLM.model_config): vLLM's ModelConfig names
        (max_model_len, dtype, hf_config, get_vocab_size() ...) and the model config's."""
        return self.engine.model_config

    def get_tokenizer(self):
        """The engine's HF tokenizer (None with skip_tokenizer_init)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        prompt_token_ids: list[int] | list[list[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order (the options after
        sampling_params are keyword-only, as vLLM's). priority (one per
        prompt) orders admission under scheduling_policy="priority": lower runs earlier.
        lora_request: one LoRARequest for every prompt, or one (or None) per prompt.
        prompt_token_ids: vLLM's older spelling of token prompts (prompts, if given, are
        their texts)."""
        check_runner(self.runner_type, "generate", "generate")
        if prompt_token_ids is not None:
            prompts = legacy_token_prompts(prompts, prompt_token_ids)
        elif prompts is None:
            raise ValueError("prompts: give the prompts to generate from")
        prompts = as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _final_only(_params_list(sampling_params, len(prompts)))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority: got {len(priority)} values for {len(prompts)} prompts")
        prios = list(priority) if priority is not None else [0] * len(prompts)
        loras = _per_prompt(lora_request, len(prompts))
        ids = []
        try:
            for prompt, p, prio, lora in zip(prompts, params, prios, loras):
                ids.append(str(next(self._ids)))
                self.engine.add_request(ids[-1], prompt, p, priority=prio, lora_request=lora)
        except Exception:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template (the tokenizer's, or chat_template) to each conversation,
        then generate, as vLLM's LLM.chat: tools and chat_template_kwargs reach the template,
        continue_final_message continues the last message, add_special_tokens adds the
        tokenizer's own (the template has them). chat_template_content_format "string"
        gives the template each content as one string, "openai" as a list of text parts,
        "auto" the parts where the template reads only parts (as vLLM's detection).
        ValueError naming the message when one is malformed (content None is empty)."""
        check_runner(self.runner_type, "generate", "chat")
        prompts = self.preprocess_chat(
            messages, None, chat_template, chat_template_content_format, add_generation_prompt,
            continue_final_message, tools, chat_template_kwargs, mm_processor_kwargs,
            add_special_tokens=add_special_tokens)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)

    def preprocess_chat(
        self,
        messages: list[dict] | list[list[dict]],
        lora_request: LoRARequest | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        *, add_special_tokens: bool = False,
    ) -> list[dict[str, Any]]:
        """vLLM's: chat's rendering without generating, one token prompt per conversation
        ({"prompt_token_ids", and "prompt": the rendered text}) for generate or the other
        methods; the arguments are chat's (lora_request is taken: adapters share the base
        tokenizer). ValueError for mm_processor_kwargs and a malformed message, by name."""
        if mm_processor_kwargs is not None:
            raise ValueError("mm_processor_kwargs: multimodal inputs are not supported: this "
                             "is a text-only engine")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        options = ChatOptions(chat_template, chat_template_content_format,
                              add_generation_prompt, continue_final_message, tools,
                              chat_template_kwargs)
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("messages: a chat is rendered by the tokenizer; this LLM has none")
        prompts = [options.render(tok, conv) for conv in convs]
        for text in prompts:
            self.engine.inputs.check_text_prompt(text, "messages")
        # each output's prompt is the rendered conversation, as vLLM's chat
        return [{"prompt_token_ids": tok.encode(p, add_special_tokens=add_special_tokens),
                 "prompt": p} for p in prompts]

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams,
                    lora_request: LoRARequest | Sequence[LoRARequest] | None = None,
                    use_tqdm: bool = False, concurrency_limit: int | None = None
                    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (entrypoints/beam_search.py): each prompt's beam_width best
        sequences, best first; each step's candidates come from generate()."""
        check_runner(self.runner_type, "generate", "beam_search")
        return beam_search(self, as_prompt_list(prompts), params, lora_request)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache's block hashes (vLLM's; True: it was reset)."""
        self.engine.reset_prefix_cache()
        return True

    def set_tokenizer(self, tokenizer: Any) -> None:
        """vLLM's tokenizer swap, which this engine does not have: NotImplementedError."""
        raise NotImplementedError("set_tokenizer() is not supported by compiled-llm: give "
                                  "LLM(tokenizer=...) when building the engine")

    def start_profile(self) -> None:
        """vLLM's torch-profiler hooks, which this engine does not have: NotImplementedError."""
        raise NotImplementedError("start_profile() is not supported by compiled-llm: profile "
                                  "with torch.profiler around generate() (engine_core_process"
                                  "=False keeps the model in this process)")

    def stop_profile(self) -> None:
        """vLLM's torch-profiler hooks, which this engine does not have: NotImplementedError."""
        raise NotImplementedError("stop_profile() is not supported by compiled-llm")

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode, which this engine does not have: NotImplementedError."""
        raise NotImplementedError("sleep() is not supported by compiled-llm (no sleep mode); "
                                  "shutdown() gives back the device memory")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's sleep mode, which this engine does not have: NotImplementedError."""
        raise NotImplementedError("wake_up() is not supported by compiled-llm (no sleep mode)")

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list:
        """vLLM's RPC to its worker objects, which this engine does not expose:
        NotImplementedError."""
        raise NotImplementedError("collective_rpc() is not supported by compiled-llm: its "
                                  "workers take no RPC calls")

    def apply_model(self, func: Any) -> list:
        """vLLM's hook running func on each worker's model, which this engine (whose model
        may live in its engine-core process, compiled) does not expose: NotImplementedError."""
        raise NotImplementedError("apply_model() is not supported by compiled-llm: the model "
                                  "is not reachable from LLM")

    def _run(self, ids: list[str], use_tqdm: bool | Callable[..., Any]) -> list[RequestOutput]:
        """Step until every request ends; use_tqdm: a progress bar, or (vLLM's) the callable
        that makes one, e.g. functools.partial(tqdm, leave=False)."""
        done: dict[str, RequestOutput] = {}
        make_bar = use_tqdm if callable(use_tqdm) else tqdm
        bar = make_bar(total=len(ids), desc="Processed prompts", dynamic_ncols=True) \
            if use_tqdm else None
        tokens = [0, 0]  # prompt and output tokens of the finished requests
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        if bar is not None:
                            _advance(bar, out, tokens)
        except BaseException:
            # Ctrl-C (or a step that raised) leaves no request holding KV blocks, nor for
            # the next call to finish first; the original error is the one raised
            with contextlib.suppress(Exception):
                self.engine.abort_request([i for i in ids if i not in done])
            raise
        if bar is not None:
            bar.close()
        return [done[i] for i in ids]


def _advance(bar: Any, out: Any, tokens: list[int]) -> None:
    """One more request done on bar, with vLLM's postfix: input and output tokens a second
    so far (a bar without tqdm's format_dict just counts)."""
    outputs = getattr(out, "outputs", None)
    if isinstance(outputs, list):
        tokens[0] += len(out.prompt_token_ids or ()) * len(outputs)
        tokens[1] += sum(len(getattr(o, "token_ids", ())) for o in outputs)
    elapsed = getattr(bar, "format_dict", {}).get("elapsed")
    if elapsed:
        bar.postfix = (f"est. speed input: {tokens[0] / elapsed:.2f} toks/s, "
                       f"output: {tokens[1] / elapsed:.2f} toks/s")
    bar.update(1)


CONTENT_FORMATS = ("auto", "string", "openai")
# LLM.chat arguments chat_template_kwargs may also carry: it wins (vLLM updates with it)
_CHAT_ARGS = ("chat_template", "add_generation_prompt", "continue_final_message", "tools")


@dataclasses.dataclass
class ChatOptions:
    """How LLM.chat renders a conversation; checked on construction (ValueError naming the
    argument)."""

    chat_template: str | None = None
    content_format: str = "auto"
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.template_kwargs or {}, dict):
            raise ValueError(f"chat_template_kwargs must be a dict, got "
                             f"{type(self.template_kwargs).__name__}")
        extra = dict(self.template_kwargs or {})
        for name in _CHAT_ARGS:
            if name in extra:
                setattr(self, name, extra.pop(name))
        self.template_kwargs = extra
        if self.content_format not in CONTENT_FORMATS:
            raise ValueError(f"chat_template_content_format must be one of {CONTENT_FORMATS}, "
                             f"got {self.content_format!r}")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message=True needs add_generation_prompt=False "
                             "(the reply continues the last message, not a new one)")
        if self.tools is not None and not isinstance(self.tools, list):
            raise ValueError(f"tools must be a list of tool dicts, got "
                             f"{type(self.tools).__name__}")

    def render(self, tokenizer, messages: list) -> str:
        """The conversation as prompt text (ValueError naming what is wrong)."""
        if tokenizer is None:
            raise ValueError("messages: chat needs a tokenizer")
        conv = conversation(messages)  # checks every message; contents as strings
        if resolved_format(tokenizer, self.chat_template, self.content_format) == "openai":
            conv = [{**msg, "content": _text_parts(orig)} for msg, orig in zip(conv, messages)]
        return render(tokenizer, conv, add_generation_prompt=self.add_generation_prompt,
                      tools=self.tools, template_kwargs=self.template_kwargs,
                      chat_template=self.chat_template,
                      continue_final_message=self.continue_final_message)


def _text_parts(message: dict) -> list[dict[str, str]]:
    """A checked message's content as OpenAI text parts (a string is one; None is none)."""
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": part["text"]} for part in content]


def offline_core_process(args: EngineArgs) -> bool:
    """Whether LLM runs its engine core in a process of its own: as asked, else on CUDA
    (measured faster offline: output processing overlaps the device) and not on the CPU,
    where the model computes on the same few cores the second process would take."""
    if args.engine_core_process is not None:
        return args.engine_core_process
    return resolve_device(args.device).type == "cuda"


def _final_only(params: list[SamplingParams]) -> list[SamplingParams]:
    """generate returns finished outputs only, so the engine need build no per-step output
    for the requests (which costs O(tokens so far) a request a step). The caller's params
    are left as they are."""
    made: dict[int, SamplingParams] = {}
    for p in params:
        if id(p) not in made:
            made[id(p)] = dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
    return [made[id(p)] for p in params]


def legacy_token_prompts(texts: Any, token_ids: list[int] | list[list[int]]) -> list[dict]:
    """vLLM's older generate(prompts, prompt_token_ids=...) as token prompts: one list of
    ids or a list of them, with the texts (one per prompt) as their prompt when given."""
    if token_ids and isinstance(token_ids[0], int):
        token_ids = [token_ids]
    prompts: list[dict] = [{"prompt_token_ids": list(ids)} for ids in token_ids]
    if texts is None:
        return prompts
    texts = [texts] if isinstance(texts, str) else list(texts)
    if len(texts) != len(prompts):
        raise ValueError(f"prompt_token_ids: got {len(prompts)} for {len(texts)} prompts")
    return [{**p, "prompt": t} for p, t in zip(prompts, texts)]


def _per_prompt(lora_request, n: int) -> list:
    """One LoRARequest (or None) per prompt; ValueError naming lora_request on a count that
    does not match."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    if not isinstance(lora_request, Sequence) or isinstance(lora_request, str):
        raise ValueError(f"lora_request must be a LoRARequest or a list of them, got "
                         f"{type(lora_request).__name__}")
    if len(lora_request) != n:
        raise ValueError(f"lora_request: got {len(lora_request)} for {n} prompts")
    return list(lora_request)


def _params_list(params, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt; ValueError naming sampling_params on a count that does
    not match or a value that is no SamplingParams (as the engine's add_request)."""
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * n
    if not isinstance(params, Sequence) or isinstance(params, str):
        raise ValueError(f"sampling_params must be SamplingParams or a list of them, got "
                         f"{type(params).__name__}")
    params = list(params)
    if len(params) != n:
        raise ValueError(f"sampling_params: got {len(params)} for {n} prompts")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{i}] must be SamplingParams, got "
                             f"{type(p).__name__}")
    return params
