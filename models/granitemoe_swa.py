"""Granite MoE SWA (GraniteMoeSWAForCausalLM: granite-swash MoE): Granite SWA's attention (sink
logits, sliding layers per layer_types, a RoPE base per layer, 0: none) over GraniteMoeShared's
layer (softmax top-k experts plus an ungated shared MLP, Granite's four scalars)."""

from __future__ import annotations

import dataclasses

from compiled_llm.models.granite_swa import GraniteSWAAttention, GraniteSWAConfig, GraniteSWAModel
from compiled_llm.models.granitemoeshared import (
    GraniteMoeSharedConfig,
    GraniteMoeSharedDecoderLayer,
    GraniteMoeSharedForCausalLM,
)


@dataclasses.dataclass
class GraniteMoeSWAConfig(GraniteSWAConfig, GraniteMoeSharedConfig):
    """GraniteSWAConfig's layer types and RoPE bases read over GraniteMoeSharedConfig's
    experts and shared MLP width."""


class GraniteMoeSWADecoderLayer(GraniteMoeSharedDecoderLayer):
    """GraniteMoeShared's layer with Granite SWA's attention."""

    attention_cls = GraniteSWAAttention


class GraniteMoeSWAModel(GraniteSWAModel):
    """Granite SWA's model (a rotary table per RoPE base) over GraniteMoeSWA layers."""

    layer_cls = GraniteMoeSWADecoderLayer


class GraniteMoeSWAForCausalLM(GraniteMoeSharedForCausalLM):
    """GraniteMoeSWA for causal LM: GraniteMoeShared's contract and weight names (tensor
    parallelism as its, with Granite SWA's sinks) over GraniteMoeSWAModel."""

    model_cls = GraniteMoeSWAModel
    config_cls = GraniteMoeSWAConfig
    # transformers' GraniteMoeSWAConfig defaults
    hf_defaults = {**GraniteMoeSharedForCausalLM.hf_defaults, "sliding_window": 128,
                   "rms_norm_eps": 1e-6, "max_position_embeddings": 2048}
    # its window is layer_types' and sliding_window's (GraniteMoe's list less those two)
    hf_unread = tuple(key for key in GraniteMoeSharedForCausalLM.hf_unread
                      if key not in ("sliding_window", "layer_types"))
