"""Cohere Compass text decoder (CohereCompassForCausalLM, the text stack of
CohereCompassForConditionalGeneration): Cohere's parallel layer (bias-free LayerNorm, logit_scale)
with rotate-half RoPE of each layer type's own rope_parameters (null: no RoPE there), M-RoPE
read as plain RoPE on text positions, and a sliding window where layer_types says."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.cohere import (
    CohereConfig,
    CohereDecoderLayer,
    CohereForCausalLM,
    CohereModel,
)
from compiled_llm.models.config import MOE_KEYS, rope_params
from compiled_llm.models.llama import LlamaAttention
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary

SLIDING, FULL = "sliding_attention", "full_attention"
ARCH = "CohereCompassForCausalLM"
# M-RoPE turns each frequency by the temporal, height or width position; on text the three are
# one position, so every section turns as plain RoPE (transformers 5.25's reading). 5.17
# permutes the default rope's height/width frequencies, which text positions do not undo: its
# outputs differ from 5.25's on default-rope layers (linear and the others agree); we follow 5.25
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def _layer_ropes(hf: dict[str, Any], kinds: list[str]) -> tuple[list[int], list[tuple]]:
    """(each layer's rope table index, -1 for none; the tables' (rope_theta, scaling)) from
    rope_parameters, one entry (or null) per layer type, as transformers requires."""
    params = hf.get("rope_parameters")
    if not isinstance(params, dict) or not set(kinds) <= set(params):
        raise ValueError(f"rope_parameters {params!r} is not supported for {ARCH}: give one "
                         f"entry (a rope dict, or null) per layer type {sorted(set(kinds))}")
    tables, index = [], {}
    for kind in dict.fromkeys(kinds):
        if params[kind] is None:
            index[kind] = -1
            continue
        if not isinstance(params[kind], dict):
            raise ValueError(f"rope_parameters.{kind} {params[kind]!r} is not supported")
        flat = {key: value for key, value in params[kind].items() if key not in MROPE_KEYS}
        index[kind] = len(tables)
        tables.append(rope_params({"rope_parameters": flat, "max_position_embeddings":
                                   hf.get("max_position_embeddings", 8192)}))
    return [index[kind] for kind in kinds], tables


@dataclasses.dataclass
class CohereCompassConfig(CohereConfig):
    """CohereConfig plus each layer's rope table (-1: none) and the tables' (theta, scaling)."""

    layer_ropes: tuple[int, ...] = ()
    ropes: tuple[tuple[float, dict[str, Any]], ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> CohereCompassConfig:
        """transformers' CohereCompassTextConfig keys: layer_types (default every layer full),
        head_dim always hidden_size / num_attention_heads, logit_scale null meaning 1;
        ValueError naming a field it cannot follow."""
        hf = {**defaults, **hf_config}
        layers = hf["num_hidden_layers"]
        kinds = list(hf.get("layer_types") or [FULL] * layers)
        if len(kinds) != layers or not set(kinds) <= {SLIDING, FULL}:
            raise ValueError(f"layer_types {kinds!r} is not supported for {ARCH}: give "
                             f"{layers} of {[SLIDING, FULL]}")
        if SLIDING in kinds and not hf.get("sliding_window"):
            raise ValueError(f"sliding_window {hf.get('sliding_window')!r} is not supported "
                             f"for {ARCH} with sliding_attention layers: give a window")
        layer_ropes, tables = _layer_ropes(hf, kinds)
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
        logit_scale = 1.0 if hf.get("logit_scale") is None else hf["logit_scale"]
        base = super().from_hf({**hf, "layer_types": kinds, "head_dim": head_dim,
                                "rope_parameters": {"rope_type": "default"},
                                "logit_scale": logit_scale})
        for _, scaling in tables:
            cls.check_rotary(scaling, head_dim)
        return dataclasses.replace(base, layer_ropes=tuple(layer_ropes), ropes=tuple(tables))


class LayerTypeRotary(nn.Module):
    """One cos/sin table per rope_parameters entry (each layer type's own base and type)."""

    def __init__(self, cfg: CohereCompassConfig, max_len: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(RotaryEmbedding(dataclasses.replace(
            cfg, rope_theta=theta, rope_scaling=scaling), max_len) for theta, scaling in cfg.ropes)

    def forward(self, positions: torch.Tensor):
        """((cos, sin) [T, 1, D] of each table)."""
        return tuple(table(positions) for table in self.tables)


class CohereCompassAttention(LlamaAttention):
    """LlamaAttention turned by its layer type's table (rotate-half), or not at all."""

    def __init__(self, cfg: CohereCompassConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.rope_index = cfg.layer_ropes[layer_idx]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, ropes):
        """q [T, H, D], k [T, Hkv, D] turned by this layer type's table, if it has one."""
        return (q, k) if self.rope_index < 0 else apply_rotary(q, k, ropes[self.rope_index])


class CohereCompassDecoderLayer(CohereDecoderLayer):
    """Cohere's parallel layer with CohereCompassAttention."""

    attention_cls = CohereCompassAttention


class CohereCompassModel(CohereModel):
    """Cohere's model with Compass layers and a table per layer type."""

    layer_cls = CohereCompassDecoderLayer

    def __init__(self, cfg: CohereCompassConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.rotary_emb = LayerTypeRotary(cfg, max_len)


class CohereCompassForCausalLM(CohereForCausalLM):
    """Cohere Compass for causal LM: Cohere's contract (logits times logit_scale) over
    CohereCompassModel; tensor and pipeline parallelism and LoRA as Cohere's."""

    model_cls = CohereCompassModel
    config_cls = CohereCompassConfig
    hf_defaults = {"layer_norm_eps": 1e-5, "logit_scale": 1.0, "use_qk_norm": False,
                   "tie_word_embeddings": True, "max_position_embeddings": 8192,
                   "sliding_window": 4096, "attention_bias": False}
    # transformers' CohereCompassText reads layer_types and sliding_window alone of the window
    # keys, no experts, no q/k norms, o_proj biased as q/k/v, the MLP never biased, head_dim
    # derived, LayerNorms only
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "use_qk_norm",
                            "qkv_bias", "o_proj_bias", "mlp_bias", "rms_norm_eps", "head_dim")
