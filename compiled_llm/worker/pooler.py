"""Pooling: per-token hidden states of a flat batch -> one vector per sequence (CLS, LAST or
MEAN), L2 normalisation and Matryoshka truncation, and the pooler settings read from a model
directory as sentence-transformers does (modules.json, its Pooling module's config.json, a
Normalize module), with pooler_config's fields taking precedence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from compiled_llm.pooling_params import PoolerConfig
from compiled_llm.worker.loader import read_json

# sentence-transformers' Pooling config keys -> our pooling types
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
             "pooling_mode_lasttoken": "LAST"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")


def sentence_transformers_pooler(model_dir: str | Path) -> PoolerConfig:
    """The pooling type and normalisation the directory's modules.json describes (fields left
    None where it has none); ValueError for a pooling mode not implemented here."""
    modules = read_json(Path(model_dir) / "modules.json")
    if not isinstance(modules, list):
        return PoolerConfig()
    pooling_type, normalize = None, False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(".Normalize"):
            normalize = True
        elif kind.endswith(".Pooling"):
            pooling_type = _st_pooling_type(Path(model_dir) / module.get("path", ""))
    return PoolerConfig(pooling_type=pooling_type, normalize=normalize)


def _st_pooling_type(pooling_dir: Path) -> str | None:
    config = read_json(pooling_dir / "config.json")
    for key in _ST_UNSUPPORTED:
        if config.get(key):
            raise ValueError(f"{pooling_dir}/config.json: {key} is not supported; "
                             f"pooling types are {sorted(_ST_MODES.values())}")
    chosen = [mode for key, mode in _ST_MODES.items() if config.get(key)]
    if len(chosen) > 1:
        raise ValueError(f"{pooling_dir}/config.json: more than one pooling mode: {chosen}")
    return chosen[0] if chosen else None


def resolve_pooler(model_dir: str | Path, default_type: str,
                   override: PoolerConfig) -> PoolerConfig:
    """pooler_config's fields, else the sentence-transformers files', else default_type and
    normalize=True (vLLM's defaults for an embedding model)."""
    from_dir = sentence_transformers_pooler(model_dir)
    out = PoolerConfig(pooling_type=default_type, normalize=True)
    for source in (from_dir, override):
        for f in dataclasses.fields(source):
            value = getattr(source, f.name)
            if value is not None:
                out = dataclasses.replace(out, **{f.name: value})
    return out


def pool(hidden: torch.Tensor, lens: list[int], pooling_type: str) -> torch.Tensor:
    """hidden [T, D] of sequences of `lens` tokens packed in order -> [B, D] in float32."""
    starts = torch.tensor([0, *lens[:-1]]).cumsum(0)
    if pooling_type == "CLS":
        return hidden[starts.to(hidden.device)].float()
    if pooling_type == "LAST":
        ends = starts + torch.tensor(lens) - 1
        return hidden[ends.to(hidden.device)].float()
    if pooling_type == "MEAN":
        segment = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
        sums = torch.zeros(len(lens), hidden.shape[1], device=hidden.device)
        sums.index_add_(0, segment.to(hidden.device), hidden[:sum(lens)].float())
        return sums / torch.tensor(lens, device=hidden.device, dtype=torch.float32)[:, None]
    raise ValueError(f"pooling_type must be one of MEAN, CLS, LAST, got {pooling_type!r}")


def embedding_head(pooled: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """One pooled row [D] -> the embedding: first `dimensions` (Matryoshka), then L2 norm."""
    if dimensions is not None:
        pooled = pooled[..., :dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def class_probs(logits: torch.Tensor, use_activation: bool) -> torch.Tensor:
    """logits [B, L] -> probabilities: softmax over labels, sigmoid for one label (a
    cross-encoder's score), or the logits themselves without the activation."""
    logits = logits.float()
    if not use_activation:
        return logits
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)
