"""The offline API, shaped like vLLM's: LLM(model=...).generate(...) and .chat(...)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import count
from typing import Any

from tqdm.auto import tqdm

from compiled_llm.config import EngineArgs
from compiled_llm.engine.llm_engine import DEMO_MODEL, LLMEngine, resolve_device
from compiled_llm.entrypoints.chat_utils import conversation, render
from compiled_llm.entrypoints.llm_pooling import PoolingMixin, as_prompt_list, check_runner
from compiled_llm.lora.request import LoRARequest
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams

PromptType = str | list[int] | dict


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

    def get_tokenizer(self):
        """The engine's HF tokenizer (None with skip_tokenizer_init)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order. priority (one per
        prompt) orders admission under scheduling_policy="priority": lower runs earlier.
        lora_request: one LoRARequest for every prompt, or one (or None) per prompt."""
        check_runner(self.runner_type, "generate", "generate")
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
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to each conversation, then generate (with
        lora_request as generate takes it); ValueError naming the message when one is
        malformed (content None counts as empty)."""
        check_runner(self.runner_type, "generate", "chat")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        prompts = [render(tok, conversation(c), chat_template=chat_template,
                          add_generation_prompt=add_generation_prompt) for c in convs]
        for text in prompts:
            self.engine.inputs.check_text_prompt(text, "messages")
        ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        # each output's prompt is the rendered conversation, as vLLM's
        return self.generate([{"prompt_token_ids": i, "prompt": p} for i, p in zip(ids, prompts)],
                             sampling_params, use_tqdm, lora_request=lora_request)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[i] for i in ids]


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
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"sampling_params: got {len(params)} for {n} prompts")
    return params
