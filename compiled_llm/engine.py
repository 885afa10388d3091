"""LLMEngine: wires tokenizer, scheduler, KV manager, runner and output processing, and runs
one step at a time. Requests with n > 1 fan out into n child sequences."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from compiled_llm.config import EngineArgs
from compiled_llm.kv_cache import KVCacheManager
from compiled_llm.loader import load_hf_config, load_model, read_json, resolve_dtype
from compiled_llm.model_runner import ModelRunner, dummy_schedule, num_kv_blocks
from compiled_llm.output_processor import OutputProcessor, request_output
from compiled_llm.outputs import RequestOutput
from compiled_llm.request import Request, RequestStatus
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.scheduler import Scheduler
from compiled_llm.structured_outputs import GrammarManager

logger = logging.getLogger(__name__)
DEMO_MODEL = Path(__file__).parent / "data" / "demo_model"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def eos_ids(model_dir: str, hf: dict[str, Any], tokenizer) -> tuple[int, ...]:
    """EOS ids from generation_config.json, else config.json, else the tokenizer."""
    gen = read_json(Path(model_dir) / "generation_config.json")
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        model_dir = str(args.model or DEMO_MODEL)
        torch.manual_seed(args.seed)
        self.device = resolve_device(args.device)
        hf = load_hf_config(model_dir)
        self.dtype = resolve_dtype(args.dtype, hf, self.device)
        self.tokenizer = None if args.skip_tokenizer_init else self._load_tokenizer(model_dir)
        sched_cfg = args.scheduler_config(hf.get("max_position_embeddings", 2048))
        self.max_model_len = sched_cfg.max_model_len
        model = load_model(model_dir, self.dtype, self.device, sched_cfg.max_model_len,
                           args.load_format)
        self.runner = ModelRunner(model, self.device, self.dtype, args.cache_config(),
                                  args.compile_config())
        num_blocks = num_kv_blocks(self.runner, sched_cfg.max_num_batched_tokens,
                                   sched_cfg.max_model_len)
        self.runner.allocate_kv_cache(num_blocks)
        self.runner.execute(dummy_schedule(1, args.block_size, 1))  # the decode shape, compiled now
        self.kv = KVCacheManager(num_blocks, args.block_size)
        self.scheduler = Scheduler(sched_cfg, self.kv)
        self.outputs = OutputProcessor(self.tokenizer)
        self.eos_token_ids = eos_ids(model_dir, hf, self.tokenizer)
        self.parents: dict[str, list[Request]] = {}
        self.grammars: GrammarManager | None = None
        logger.info("engine ready: %s on %s, %d KV blocks", model_dir, self.device, num_blocks)

    def _load_tokenizer(self, model_dir: str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.args.tokenizer or model_dir)

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}."""
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a text prompt needs a tokenizer")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            vocab = self.runner.model.config.vocab_size
            if not prompt or any(t < 0 or t >= vocab for t in prompt):
                raise ValueError(f"prompt_token_ids must be non-empty ids in [0, {vocab})")
            return None, prompt
        raise ValueError(f"prompt must be a str or a list of token ids, got {type(prompt)}")

    def add_request(self, request_id: str, prompt: str | list[int] | dict,
                    params: SamplingParams | None = None, priority: int = 0) -> None:
        """Validate and queue; raises ValueError (naming the field) without side effects."""
        if request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = params or SamplingParams()
        text, ids = self.tokenize(prompt)
        children = [self._child(request_id, i, text, ids, params, priority)
                    for i in range(params.n)]
        for c in children:  # check all before queueing any
            self._check_fits(c)
        if params.structured_outputs is not None:
            self._attach_grammars(children, params.structured_outputs)
        for c in children:
            self.outputs.start(c)
            self.scheduler.add_request(c)
        self.parents[request_id] = children

    def _child(self, rid: str, i: int, text, ids, params: SamplingParams, priority) -> Request:
        p = params
        if params.n > 1:
            p = params.clone()
            p.n = 1
            if p.seed is not None:
                p.seed += i
            if i > 0:
                p.prompt_logprobs = None
        cid = rid if params.n == 1 else f"{i}_{rid}"
        return Request(cid, list(ids), p, self.eos_token_ids, text, priority=priority,
                       parent_id=rid)

    def _check_fits(self, req: Request) -> None:
        if req.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt is {req.num_prompt_tokens} tokens, max_model_len is "
                f"{self.max_model_len}; the prompt plus output must fit"
            )

    def _attach_grammars(self, children: list[Request], spec) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer")
        if self.grammars is None:  # built on first use: costly for large vocabularies
            self.grammars = GrammarManager(self.tokenizer, self.runner.model.config.vocab_size,
                                           self.eos_token_ids)
        self.grammars.compile(spec)  # raises ValueError before any child gets a matcher
        for c in children:
            c.grammar = self.grammars.matcher(spec)

    def abort_request(self, request_id: str) -> None:
        for c in self.parents.pop(request_id, []):
            self.scheduler.abort(c.request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_used_blocks(self) -> int:
        return self.kv.num_used_blocks

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and return outputs of requests that progressed."""
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        result = self.runner.execute(sched)
        for rid, rows in result.prompt_logprobs.items():
            self.outputs.add_prompt_logprobs(self.scheduler_request(rid, sched), rows)
        touched = self.scheduler.update(sched, result.sampled)
        for req in touched:
            self._advance_grammar(req)
            stop = self.outputs.process_token(req, result)
            if stop is not None:
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED, stop)
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        return self._collect(touched)

    def _advance_grammar(self, req: Request) -> None:
        """Feed req's new token to its matcher; a terminated grammar ends the request."""
        if req.grammar is None:
            return
        if not req.grammar.accept_token(req.output_token_ids[-1]):
            req.error = "structured_outputs: a sampled token was rejected by the grammar"
            self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
        elif req.grammar.is_terminated():
            self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)

    @staticmethod
    def scheduler_request(rid: str, sched) -> Request:
        return next(r for r, _ in sched.scheduled if r.request_id == rid)

    def _collect(self, touched: list[Request]) -> list[RequestOutput]:
        parents = dict.fromkeys(r.parent_id for r in touched)
        outs = []
        for pid in parents:
            out = request_output(pid, self.parents[pid])
            if out is None:
                continue
            if out.finished:
                del self.parents[pid]
            outs.append(out)
        return outs

