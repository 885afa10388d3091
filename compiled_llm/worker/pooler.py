"""Pooling: per-token hidden states of a flat batch -> one vector per sequence (CLS, LAST or
MEAN), L2 normalisation and Matryoshka truncation, and the pooler settings read from a model
directory as sentence-transformers does (modules.json, its Pooling module's config.json, a
Normalize module), with pooler_config's fields taking precedence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from compiled_llm.pooling_params import PoolerConfig
from compiled_llm.sample.uploads import upload
from compiled_llm.worker.loader import read_json

# sentence-transformers' Pooling config keys -> our pooling types
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
             "pooling_mode_lasttoken": "LAST"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")
# sentence-transformers 6's pooling_mode values -> the older flag keys
_ST_MODE_NAMES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                  "lasttoken": "pooling_mode_lasttoken", "max": "pooling_mode_max_tokens",
                  "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                  "weightedmean": "pooling_mode_weightedmean_tokens"}


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
    # sentence-transformers >= 6 writes "pooling_mode": "mean" (or a list of modes) in place
    # of the older pooling_mode_<mode>_tokens flags; both spellings name the same modes
    modes = config.get("pooling_mode")
    for mode in [modes] if isinstance(modes, str) else (modes or []):
        config[_ST_MODE_NAMES.get(mode, f"pooling_mode_{mode}")] = True
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
    """hidden [T, D] of sequences of `lens` tokens packed in order -> [B, D] in float32. The
    index tensors go up from pinned memory without blocking (no host sync on CUDA)."""
    device = hidden.device
    lengths = np.asarray(lens, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    if pooling_type == "CLS":
        return hidden[upload(starts, torch.int64, device)].float()
    if pooling_type == "LAST":
        return hidden[upload(starts + lengths - 1, torch.int64, device)].float()
    if pooling_type == "MEAN":
        segment = upload(np.repeat(np.arange(len(lens)), lengths), torch.int64, device)
        sums = torch.zeros(len(lens), hidden.shape[1], device=device)
        sums.index_add_(0, segment, hidden[:int(lengths.sum())].float())
        return sums / upload(lengths, torch.float32, device)[:, None]
    raise ValueError(f"pooling_type must be one of MEAN, CLS, LAST, got {pooling_type!r}")


def embedding_head(pooled: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """One pooled row [D] (or rows [B, D] sharing the settings) -> the embedding: first
    `dimensions` (Matryoshka), then L2 norm."""
    if dimensions is not None:
        pooled = pooled[..., :dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def row_groups(keys: list) -> list[tuple[object, list[int]]]:
    """(key, the row indices that have it) per distinct key, in first-seen order: the rows a
    per-request setting splits one step's batch into (one group in the usual call)."""
    groups: dict = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return list(groups.items())


def embedding_groups(pooled: torch.Tensor, normalize: list[bool], dimensions: list[int | None]
                     ) -> list[tuple[list[int], torch.Tensor]]:
    """pooled [B, D] -> (row indices, their embeddings [n, D']) per distinct (normalize,
    dimensions) setting, on pooled's device: the head is one op per group, and each group one
    copy to the host."""
    groups = row_groups(list(zip(normalize, dimensions)))
    if len(groups) == 1:
        (norm, dims), rows = groups[0]
        return [(rows, embedding_head(pooled, norm, dims))]
    return [(rows, embedding_head(pooled[upload(rows, torch.int64, pooled.device)], norm, dims))
            for (norm, dims), rows in groups]


def class_probs(logits: torch.Tensor, use_activation: bool) -> torch.Tensor:
    """logits [B, L] -> probabilities: softmax over labels, sigmoid for one label (a
    cross-encoder's score), or the logits themselves without the activation."""
    logits = logits.float()
    if not use_activation:
        return logits
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)


def class_prob_groups(logits: torch.Tensor, use_activation: list[bool]
                      ) -> list[tuple[list[int], torch.Tensor]]:
    """logits [B, L] -> (row indices, their class_probs) per distinct use_activation, on
    logits' device (one group in the usual call)."""
    groups = row_groups(use_activation)
    if len(groups) == 1:
        return [(groups[0][1], class_probs(logits, groups[0][0]))]
    return [(rows, class_probs(logits[upload(rows, torch.int64, logits.device)], act))
            for act, rows in groups]
