"""PoolingEngine: the engine of runner="pooling" runs (embeddings, classification, scores).
A pooling request is one forward of its whole prompt, nothing kept after it: no scheduler, KV
cache or sampler. Prompts are validated and tokenized (texts in one batched tokenizer call,
pairs for cross-encoders, token types kept), packed into forwards within the token budget and
pooled, step k+1 launched before the host waits for step k's rows."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from compiled_llm.config import CompileConfig, EngineArgs, model_len_bounds
from compiled_llm.engine.input_processor import InputProcessor, PromptType
from compiled_llm.engine.inputs import truncated_text_ids
from compiled_llm.engine.model_config import ModelConfigView
from compiled_llm.models import ModelRegistry
from compiled_llm.models.plugins import load_general_plugins
from compiled_llm.pooling_params import PoolerConfig, PoolingParams
from compiled_llm.worker.loader import load_hf_config, load_model, read_json, resolve_dtype
from compiled_llm.worker.pooler import resolve_pooler
from compiled_llm.worker.pooling_runner import HostRows, PoolingRunner
from compiled_llm.worker.st_dense import st_projector

logger = logging.getLogger(__name__)
Tokens = tuple[list[int], list[int] | None]  # (token ids, token types or None)
# the default token budget of one pooling forward (vLLM's POOLING_MODEL_MAX_NUM_BATCHED_TOKENS)
POOLING_MAX_NUM_BATCHED_TOKENS = 32768
QK_FUSION = "enable_qk_norm_rope_kv_write"


def pooling_compile_config(args: EngineArgs) -> CompileConfig:
    """args' compile settings, with the fused QK-norm + RoPE + KV write off unless asked for: a
    pooling forward has no KV cache, so that op would run its eager reference, not the kernel."""
    config = args.compile_config()
    if QK_FUSION in args.passes:
        return config
    return dataclasses.replace(config, passes={**config.passes, QK_FUSION: False})


def resolve_runner(args: EngineArgs, model_dir: str) -> str:
    """"generate" or "pooling" for args.runner on the model in model_dir (auto: pooling for
    pooling-only architectures); ValueError naming runner or pooler_config when they clash."""
    load_general_plugins()
    archs = load_hf_config(model_dir).get("architectures") or []
    model_cls = ModelRegistry.resolve_model_cls(archs)
    pooling_only = getattr(model_cls, "is_pooling_model", False)
    runner = requested_runner(args)
    if args.convert == "classify" and not hasattr(model_cls, "classify"):
        raise ValueError(f"convert: {archs[0]} has no classification head to run; classify "
                         "needs a *ForSequenceClassification checkpoint")
    if runner == "auto":
        runner = "pooling" if pooling_only else "generate"
    if runner == "generate" and pooling_only:
        raise ValueError(f"runner: {archs[0]} is a pooling model (embeddings, classification, "
                         "scores), not a generative one; pass runner='pooling'")
    if runner == "generate" and args.pooler_config is not None:
        raise ValueError("pooler_config applies to runner='pooling' only")
    return runner


def requested_runner(args: EngineArgs) -> str:
    """args.runner, or where it is auto the runner vLLM's task or convert names (its older
    LLM(..., task="embed") and convert="embed" spellings); ValueError naming the field that
    contradicts an explicit runner."""
    task = None if args.task in (None, "auto") else args.task
    implied = None if task is None else ("generate" if task == "generate" else "pooling")
    if args.convert in ("embed", "classify"):
        if implied == "generate":
            raise ValueError(f"convert {args.convert!r} needs a pooling task, not task "
                             "'generate'")
        implied = "pooling"
    if args.runner == "auto" or implied is None:
        return args.runner if implied is None else implied
    if implied != args.runner:
        field = "task" if task is not None else "convert"
        raise ValueError(f"{field} {getattr(args, field)!r} needs runner={implied!r}; got "
                         f"runner={args.runner!r}")
    return args.runner


def check_pooling_args(args: EngineArgs) -> None:
    """ValueError for settings a pooling run cannot honour (CUDA graphs or an FP8 KV cache,
    asked for by name)."""
    if args.cudagraph_mode not in (None, "none"):
        raise ValueError(f"cudagraph_mode {args.cudagraph_mode!r}: CUDA graphs are not supported "
                         "with runner='pooling'; leave cudagraph_mode unset or pass 'none'")
    if args.kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype {args.kv_cache_dtype!r}: runner='pooling' keeps no KV "
                         "cache; leave kv_cache_dtype as auto")
    if args.speculative_config is not None:
        raise ValueError("speculative_config: runner='pooling' generates no tokens; leave "
                         "speculative_config unset")
    if args.world_size > 1:
        raise ValueError(f"{args.parallel_field} > 1 is not supported with runner='pooling'")
    PoolerConfig.from_value(args.pooler_config)  # names a bad key before the weights load
    if args.enable_lora:
        raise ValueError("enable_lora: LoRA adapters serve runner='generate' only")


class PoolingEngine:
    """Loads a model for pooling and runs embed/classify/score batches. Invariant: no device
    memory is held for KV (runner.kv_caches stays empty); after shutdown() it refuses work."""

    runner_type = "pooling"

    def __init__(self, args: EngineArgs) -> None:
        from compiled_llm.engine.llm_engine import DEMO_MODEL, resolve_device

        check_pooling_args(args)
        self.args = args
        model_dir = str(args.model or DEMO_MODEL)
        torch.manual_seed(args.seed)
        self.device = resolve_device(args.device)
        hf = load_hf_config(model_dir)
        self.hf_config = hf
        self.dtype = resolve_dtype(args.dtype, hf, self.device)
        self.tokenizer = (None if args.skip_tokenizer_init
                          else AutoTokenizer.from_pretrained(args.tokenizer or model_dir))
        st_len = read_json(Path(model_dir) / "sentence_bert_config.json").get("max_seq_length")
        limit, default_len = model_len_bounds(hf)
        sched = args.scheduler_config(limit, min(st_len or default_len, default_len))
        self.max_model_len, self.max_num_seqs = sched.max_model_len, sched.max_num_seqs
        self.max_num_batched_tokens = sched.max_num_batched_tokens
        if args.max_num_batched_tokens is None:  # as vLLM: a pooling forward keeps no KV
            self.max_num_batched_tokens = max(self.max_num_batched_tokens,
                                              POOLING_MAX_NUM_BATCHED_TOKENS)
        model = load_model(model_dir, self.dtype, self.device, self.max_model_len,
                           args.load_format, args.quantization)
        self.model_config = ModelConfigView(args, model.config, max_model_len=self.max_model_len,
                                            dtype=self.dtype, runner_type="pooling")
        default_type = getattr(model, "default_pooling_type", "LAST")  # may follow its config
        self.pooler = resolve_pooler(model_dir, default_type,
                                     PoolerConfig.from_value(args.pooler_config))
        self.runner = PoolingRunner(model, self.device, self.dtype, pooling_compile_config(args),
                                    args.attention_backend_for(self.device.type,
                                                              model.config.head_dim),
                                    st_projector(model_dir, self.device))
        self.inputs = InputProcessor(self.tokenizer, model.config.vocab_size, (),
                                     self.max_model_len, args)
        # Matryoshka models (config.json, as vLLM reads it): the sizes dimensions may take
        self.matryoshka: list[int] | None = hf.get("matryoshka_dimensions")
        self.is_matryoshka = bool(hf.get("is_matryoshka") or self.matryoshka)
        self.runner.hidden_states([[0]])  # the first call compiles
        logger.info("pooling engine ready: %s on %s, %s, max_model_len %d", model_dir,
                    self.device, self.pooler, self.max_model_len)

    # ------------------------------------------------------------------ what it serves
    @property
    def can_classify(self) -> bool:
        """Whether the model is a classifier (classify; score as a cross-encoder)."""
        return self.runner.can_classify

    @property
    def num_labels(self) -> int | None:
        """The classifier's label count, or None for an embedding model."""
        return self.model_config.num_labels if self.can_classify else None

    @property
    def is_cross_encoder(self) -> bool:
        """Whether score() runs pairs through the classifier (one label) or cosines."""
        return self.num_labels == 1

    @property
    def num_used_blocks(self) -> int:
        """KV blocks held: always 0 (pooling keeps no KV cache)."""
        return sum(t.numel() for t in self.runner.kv_caches)

    @property
    def embedding_size(self) -> int:
        """An embedding's length: the last Dense module's outputs, else the hidden size."""
        projector = self.runner.projector
        return projector[-2].out_features if projector else self.model_config.hidden_size

    def check_dimensions(self, dimensions: int | None) -> None:
        """ValueError naming dimensions unless the model is Matryoshka and allows it."""
        if dimensions is None:
            return
        hidden = self.embedding_size
        if not self.is_matryoshka:
            raise ValueError("dimensions: this model does not support Matryoshka embeddings "
                             "(no matryoshka_dimensions in its config.json)")
        if self.matryoshka and dimensions not in self.matryoshka:
            raise ValueError(f"dimensions must be one of {self.matryoshka}, got {dimensions}")
        if dimensions > hidden:
            raise ValueError(f"dimensions must be <= {hidden}, got {dimensions}")

    # ------------------------------------------------------------------ inputs
    def tokenize(self, prompt: PromptType, truncate: int | None = None,
                 name: str = "prompt") -> Tokens:
        """(ids, token types) of one prompt, truncated to its last `truncate` tokens (-1:
        max_model_len); ValueError naming `name` when it is malformed or too long."""
        return self.tokenize_many([prompt], [truncate], name)[0]

    def tokenize_many(self, prompts: list[PromptType], truncates: list[int | None],
                      name: str = "prompt") -> list[Tokens]:
        """tokenize of each prompt, the texts in one batched tokenizer call (a fast tokenizer
        encodes them in parallel, without a Python round trip per text). Checks run in prompt
        order before any text is tokenized; results equal one tokenize call per prompt."""
        texts: list[int] = []
        encoded: list = [None] * len(prompts)
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str) and self.tokenizer is not None:
                self.inputs.check_text_prompt(prompt, name)
                texts.append(i)
            else:
                encoded[i] = (self.inputs.tokenize(prompt)[1], None)
        if texts:
            enc = self.tokenizer([prompts[i] for i in texts], return_attention_mask=False)
            types = enc.get("token_type_ids") or [None] * len(texts)
            for i, ids, kinds in zip(texts, enc["input_ids"], types):
                encoded[i] = self._cut_text(prompts[i], list(ids), _types(kinds), truncates[i])
        return [self._fit(ids, kinds, truncate, name)
                for (ids, kinds), truncate in zip(encoded, truncates)]

    def _cut_text(self, text: str, ids: list[int], types: list[int] | None,
                  truncate: int | None) -> Tokens:
        """A text's ids cut as a left-truncating tokenizer cuts them: the special tokens it
        adds ([CLS], [SEP], a BOS) stay, the text loses its start (-1: max_model_len)."""
        keep = self.max_model_len if truncate == -1 else truncate
        ids = truncated_text_ids(self.tokenizer, text, ids, keep, self.max_model_len)
        return ids, None if types is None else types[-len(ids):]

    def tokenize_pair(self, text_1: str, text_2: str, truncate: int | None = None) -> Tokens:
        """A cross-encoder's input: both texts in one sequence, as the tokenizer pairs them."""
        if self.tokenizer is None:
            raise ValueError("text_1: scoring pairs needs a tokenizer")
        for name, text in (("text_1", text_1), ("text_2", text_2)):
            if not isinstance(text, str):
                raise ValueError(f"{name} must be a str or a list of str")
            self.inputs.check_text_prompt(text, name)
        enc = self.tokenizer(text_1, text_2)
        return self._fit(list(enc["input_ids"]), _types(enc.get("token_type_ids")), truncate,
                         "text_1")

    def _fit(self, ids: list[int], types: list[int] | None, truncate: int | None,
             name: str) -> Tokens:
        if not ids:
            raise ValueError(f"{name} must not be empty (it has no tokens)")
        if truncate is not None:
            keep = self.max_model_len if truncate == -1 else truncate
            ids, types = ids[-keep:], None if types is None else types[-keep:]
        if len(ids) > self.max_model_len:
            raise ValueError(f"{name} has {len(ids)} tokens, more than max_model_len "
                             f"{self.max_model_len} (truncate_prompt_tokens shortens it)")
        return ids, types

    def _packed(self, batch: list[Tokens]) -> list[list[int]]:
        """Token ids with each token's type in the bits the model reads it from."""
        shift = self.runner.token_type_shift
        if shift is None:
            return [ids for ids, _ in batch]
        return [ids if types is None else [i | (t << shift) for i, t in zip(ids, types)]
                for ids, types in batch]

    def batches(self, seqs: list[Tokens]) -> Iterator[list[int]]:
        """Index lists of sequences, in order, each forward within the token and sequence
        budgets (a sequence longer than the token budget runs alone)."""
        chunk, tokens = [], 0
        for i, (ids, _) in enumerate(seqs):
            if chunk and (tokens + len(ids) > self.max_num_batched_tokens
                          or len(chunk) == self.max_num_seqs):
                yield chunk
                chunk, tokens = [], 0
            chunk.append(i)
            tokens += len(ids)
        if chunk:
            yield chunk

    # ------------------------------------------------------------------ runs
    def embed(self, seqs: list[Tokens], params: list[PoolingParams]) -> list[list[float]]:
        """One embedding per sequence (its params' normalisation and dimensions)."""
        self._check_open()
        if self.can_classify:
            raise ValueError("runner: this model is a classifier; use classify (or score)")
        for p in params:
            self.check_dimensions(p.dimensions)
        steps = (self.runner.embed_start(
            self._packed([seqs[i] for i in idx]), self.pooler.pooling_type,
            [self.pooler.normalize if params[i].normalize is None else params[i].normalize
             for i in idx], [params[i].dimensions for i in idx]) for idx in self.batches(seqs))
        return _overlapped(steps)

    def classify(self, seqs: list[Tokens], params: list[PoolingParams]) -> list[list[float]]:
        """Class probabilities per sequence (softmax, sigmoid for one label)."""
        self._check_open()
        if not self.can_classify:
            raise ValueError("runner: this model has no classification head "
                             "(a *ForSequenceClassification checkpoint classifies)")
        steps = (self.runner.classify_start(self._packed([seqs[i] for i in idx]),
                                            self.pooler.pooling_type,
                                            [params[i].use_activation for i in idx])
                 for idx in self.batches(seqs))
        return _overlapped(steps)

    def _check_open(self) -> None:
        if self.runner.model is None:
            raise RuntimeError("the engine is shut down")

    def get_model_config(self) -> ModelConfigView:
        """model_config (vLLM's LLMEngine.get_model_config)."""
        return self.model_config

    def get_num_unfinished_requests(self) -> int:
        """0: each embed/classify call runs its prompts to the end before it returns."""
        return 0

    def describe(self) -> dict[str, Any]:
        """The pooler's settings, for logs and /v1/models."""
        return {"pooling_type": self.pooler.pooling_type, "normalize": self.pooler.normalize}

    def shutdown(self) -> None:
        """Free the model and compiled code (idempotent)."""
        self.runner.shutdown()


def _types(token_types: list[int] | None) -> list[int] | None:
    """A prompt's token types, None when all are 0 (packing zeros changes no id)."""
    return list(token_types) if token_types and any(token_types) else None


def _overlapped(steps: Iterator[HostRows]) -> list[list[float]]:
    """Every step's rows in order, each step's wait for the device deferred until the next one
    is launched, so the host prepares step k+1 while the device runs step k."""
    out: list[list[float]] = []
    pending: HostRows | None = None
    for step in steps:
        if pending is not None:
            out += pending.rows()
        pending = step
    if pending is not None:
        out += pending.rows()
    return out
