"""LLM's pooling methods, as vLLM spells them: embed, classify, score, encode, reward, for an LLM
built with runner="pooling" (or auto on a pooling architecture). Each refuses a generate
runner with a ValueError naming `runner`, and generate refuses a pooling one likewise."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import count
from typing import Any

from compiled_llm.output.pooling_outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from compiled_llm.pooling_params import POOLING_TASKS, PoolingParams

PromptType = str | list[int] | dict


def check_runner(actual: str, wanted: str, method: str) -> None:
    """ValueError naming runner when `method` needs another runner than the LLM was built with."""
    if actual != wanted:
        raise ValueError(f"{method}() needs runner='{wanted}'; this LLM was built with "
                         f"runner='{actual}'")


def as_prompt_list(prompts: Any, name: str = "prompts") -> list:
    """One prompt (str, ids, dict) or a sequence of them, as a list; ValueError naming `name`
    for anything else (an int, None)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
        return [prompts]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"{name} must be a str, a list of token ids, a prompt dict or a list "
                         f"of them; got {type(prompts).__name__}")
    return list(prompts)


def params_list(params: PoolingParams | Sequence[PoolingParams] | None, n: int,
                truncate: int | None) -> list[PoolingParams]:
    """One PoolingParams per prompt; truncate_prompt_tokens (the call's) fills theirs."""
    if params is None or isinstance(params, PoolingParams):
        params = [params or PoolingParams()] * n
    if not isinstance(params, Sequence) or not all(isinstance(p, PoolingParams)
                                                   for p in params):
        raise ValueError("pooling_params must be a PoolingParams or a list of them")
    params = list(params)
    if len(params) != n:
        raise ValueError(f"pooling_params: got {len(params)} for {n} prompts")
    if truncate is not None:
        params = [dataclasses.replace(p, truncate_prompt_tokens=truncate) for p in params]
    return params


def check_no_lora(lora_request: Any) -> None:
    """vLLM's pooling methods take lora_request; None is accepted, an adapter is refused with a
    ValueError naming it (LoRA serves runner='generate' only here)."""
    if lora_request is not None:
        raise ValueError("lora_request: LoRA adapters are not supported with runner='pooling'")


def score_pairs(text_1: Any, text_2: Any) -> list[tuple[Any, Any]]:
    """vLLM's pairing: one text against many, or two lists of one length zipped."""
    left, right = as_prompt_list(text_1, "text_1"), as_prompt_list(text_2, "text_2")
    if not left or not right:
        raise ValueError("text_1 and text_2 must not be empty")
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise ValueError(f"text_1 has {len(left)} items and text_2 {len(right)}: give one "
                         "text_1, or as many as text_2")
    return list(zip(left, right))


class PoolingMixin:
    """embed / classify / score / encode over self.engine, a PoolingEngine."""

    runner_type: str
    _pool_ids = count()

    def _pool_engine(self, method: str):
        check_runner(self.runner_type, "pooling", method)
        return self.engine

    def _prepared(self, method: str, prompts, pooling_params, truncate: int | None,
                  lora_request: Any = None):
        """(engine, tokenized prompts, one PoolingParams each), the runner checked."""
        engine = self._pool_engine(method)
        check_no_lora(lora_request)
        prompts = as_prompt_list(prompts)
        params = params_list(pooling_params, len(prompts), truncate)
        seqs = engine.tokenize_many(prompts, [q.truncate_prompt_tokens for q in params])
        return engine, seqs, params

    def embed(self, prompts: PromptType | Sequence[PromptType], pooling_params:
              PoolingParams | Sequence[PoolingParams] | None = None, use_tqdm: bool = True,
              truncate_prompt_tokens: int | None = None,
              lora_request: Any = None) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt, in prompt order (pooling and normalisation as the model
        directory or pooler_config says; PoolingParams.dimensions for Matryoshka models)."""
        engine, seqs, params = self._prepared("embed", prompts, pooling_params,
                                              truncate_prompt_tokens, lora_request)
        vectors = engine.embed(seqs, params)
        return [EmbeddingRequestOutput(str(next(self._pool_ids)), EmbeddingOutput(v), ids)
                for v, (ids, _) in zip(vectors, seqs)]

    def classify(self, prompts: PromptType | Sequence[PromptType], pooling_params:
                 PoolingParams | Sequence[PoolingParams] | None = None, use_tqdm: bool = True,
                 truncate_prompt_tokens: int | None = None,
                 lora_request: Any = None) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt from a *ForSequenceClassification checkpoint."""
        engine, seqs, params = self._prepared("classify", prompts, pooling_params,
                                              truncate_prompt_tokens, lora_request)
        probs = engine.classify(seqs, params)
        return [ClassificationRequestOutput(str(next(self._pool_ids)), ClassificationOutput(p),
                                            ids) for p, (ids, _) in zip(probs, seqs)]

    def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str],
              use_tqdm: bool = True, truncate_prompt_tokens: int | None = None,
              pooling_params: PoolingParams | None = None,
              lora_request: Any = None) -> list[ScoringRequestOutput]:
        """A relevance score per (text_1, text_2) pair: a cross-encoder's sigmoid (classifiers
        of one label), else the cosine of the two embeddings."""
        engine = self._pool_engine("score")
        check_no_lora(lora_request)
        pairs = score_pairs(text_1, text_2)
        params = params_list(pooling_params, 1, truncate_prompt_tokens)[0]
        if engine.is_cross_encoder:
            seqs = [engine.tokenize_pair(a, b, params.truncate_prompt_tokens) for a, b in pairs]
            scores = [p[0] for p in engine.classify(seqs, [params] * len(seqs))]
        elif engine.can_classify:
            raise ValueError(f"score needs an embedding model or a cross-encoder (num_labels 1);"
                             f" this classifier has {engine.num_labels} labels")
        else:
            scores, seqs = cosine_scores(engine, pairs, params)
        return [ScoringRequestOutput(str(next(self._pool_ids)), ScoringOutput(s), ids)
                for s, (ids, _) in zip(scores, seqs)]

    def encode(self, prompts: PromptType | Sequence[PromptType], pooling_params:
               PoolingParams | Sequence[PoolingParams] | None = None, use_tqdm: bool = True,
               truncate_prompt_tokens: int | None = None, lora_request: Any = None,
               pooling_task: str | None = None) -> list[PoolingRequestOutput]:
        """The pooler's output per prompt: embeddings, or class probabilities for classifiers
        (pooling_task, as vLLM names it, may ask for either by name)."""
        check_pooling_task(pooling_task)
        engine, seqs, params = self._prepared("encode", prompts, pooling_params,
                                              truncate_prompt_tokens, lora_request)
        classify = (engine.can_classify if pooling_task in (None, "encode")
                    else pooling_task in ("classify", "score"))
        run = engine.classify if classify else engine.embed
        import torch

        # data is a tensor, as vLLM's PoolingOutput.data
        return [PoolingRequestOutput(str(next(self._pool_ids)), PoolingOutput(torch.tensor(d)),
                                     ids) for d, (ids, _) in zip(run(seqs, params), seqs)]

    def reward(self, prompts: PromptType | Sequence[PromptType], pooling_params:
               PoolingParams | Sequence[PoolingParams] | None = None, use_tqdm: bool = True,
               truncate_prompt_tokens: int | None = None,
               lora_request: Any = None) -> list[PoolingRequestOutput]:
        """vLLM's reward: encode's output per prompt (a reward model's scores)."""
        return self.encode(prompts, pooling_params, use_tqdm, truncate_prompt_tokens,
                           lora_request)


def check_pooling_task(task: str | None) -> None:
    """ValueError naming pooling_task unless it is one this engine runs (per-token tasks,
    token_embed and token_classify, are not)."""
    if task is not None and task not in POOLING_TASKS:
        raise ValueError(f"pooling_task must be one of {POOLING_TASKS}, got {task!r}")


def cosine_scores(engine, pairs: list[tuple[Any, Any]], params: PoolingParams):
    """Cosine similarity of each pair's normalised embeddings, and each pair's tokens."""
    import torch

    truncates = [params.truncate_prompt_tokens] * len(pairs)
    left = engine.tokenize_many([a for a, _ in pairs], truncates, "text_1")
    right = engine.tokenize_many([b for _, b in pairs], truncates, "text_2")
    norm = PoolingParams(normalize=True)
    vectors = engine.embed(left + right, [norm] * (2 * len(pairs)))
    emb = torch.tensor(vectors)
    scores = (emb[:len(pairs)] * emb[len(pairs):]).sum(-1).tolist()
    # each score's prompt tokens: both texts' (what usage counts)
    return scores, [(a + b, None) for (a, _), (b, _) in zip(left, right)]
