"""Granite SWA decoder (GraniteSWAForCausalLM: granite-swash): Granite's four scalars with a
learned sink logit per query head in every softmax (GPT-OSS's sinks), a sliding window on the
layers layer_types marks (transformers' default: all but every fourth, from layer 0), and a
RoPE base per layer (layer_rope_theta; 0: that layer has no RoPE), one table per base."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS
from compiled_llm.models.granite import (
    GraniteAttention,
    GraniteConfig,
    GraniteDecoderLayer,
    GraniteForCausalLM,
    GraniteModel,
)
from compiled_llm.models.rotary import RotaryEmbedding

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass
class GraniteSWAConfig(GraniteConfig):
    """GraniteConfig plus each layer's RoPE base (0.0: no RoPE)."""

    layer_rope_theta: tuple[float, ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GraniteSWAConfig:
        """Granite's keys, layer_types (default: every fourth layer full, the rest sliding)
        and layer_rope_theta (default: rope_theta on every layer); ValueError naming a field
        the engine cannot follow."""
        hf, layers = dict(hf_config), hf_config["num_hidden_layers"]
        hf["layer_types"] = hf.get("layer_types") or [FULL if i % 4 == 0 else SLIDING
                                                      for i in range(layers)]
        kinds = hf["layer_types"]
        if len(kinds) < layers or any(kind not in (SLIDING, FULL) for kind in kinds):
            raise ValueError(f"layer_types {kinds!r} is not supported: give {SLIDING!r} or "
                             f"{FULL!r} for each of the {layers} layers")
        if SLIDING in kinds[:layers] and hf.get("sliding_window", 128) is None:
            raise ValueError("sliding_window None is not supported with sliding_attention "
                             "layers (transformers needs a window for them)")
        base = super().from_hf(hf, **defaults)
        thetas = hf.get("layer_rope_theta") or [base.rope_theta] * layers
        if len(thetas) < layers or any(isinstance(t, bool) or not isinstance(t, (int, float))
                                       or t < 0 for t in thetas):
            raise ValueError(f"layer_rope_theta {thetas!r} is not supported: give a base "
                             f"(0: no RoPE) for each of the {layers} layers")
        return dataclasses.replace(base, layer_rope_theta=tuple(map(float, thetas[:layers])))

    def rope_bases(self) -> list[float]:
        """The distinct non-zero RoPE bases, smallest first: one rotary table each."""
        return sorted({theta for theta in self.layer_rope_theta if theta})

    def rope_table(self, layer_idx: int) -> int | None:
        """The index of layer layer_idx's rotary table (None: the layer has no RoPE)."""
        theta = self.layer_rope_theta[layer_idx]
        return self.rope_bases().index(theta) if theta else None


class LayerRotaryEmbeddings(nn.Module):
    """One RoPE table per distinct non-zero base of layer_rope_theta (cfg.rope_bases());
    forward gives every table's (cos, sin) [T, 1, D], gathered once a step."""

    def __init__(self, cfg: GraniteSWAConfig, max_len: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(
            RotaryEmbedding(dataclasses.replace(cfg, rope_theta=theta), max_len)
            for theta in cfg.rope_bases())

    def forward(self, positions: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """positions [T] -> each table's (cos, sin)."""
        return tuple(table(positions) for table in self.tables)


class GraniteSWAAttention(GraniteAttention):
    """GraniteAttention with `sinks` [H] (each head's logit joins its softmax as a key of
    value 0), RoPE from its base's table (none where the base is 0)."""

    def __init__(self, cfg: GraniteSWAConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.sinks = nn.Parameter(torch.zeros(self.num_heads))
        self.rope_index = cfg.rope_table(layer_idx)

    def forward(self, hidden: torch.Tensor, ropes: tuple[tuple[torch.Tensor, torch.Tensor]]):
        """hidden [T, hidden] -> [T, hidden], scaled for the residual add; writes this layer's
        K/V into the cache."""
        q, k, v = self.qkv(hidden)
        if self.rope_index is not None:
            q, k = self.rotate(q, k, ropes[self.rope_index])
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window, True,
                             0.0, self.sinks)
        return self.o_proj(attn_out.flatten(1)) * self.residual_multiplier  # [T, hidden]


class GraniteSWADecoderLayer(GraniteDecoderLayer):
    """The Granite layer with GraniteSWAAttention."""

    attention_cls = GraniteSWAAttention


class GraniteSWAModel(GraniteModel):
    """Granite's model over Granite SWA layers, one rotary table per RoPE base."""

    layer_cls = GraniteSWADecoderLayer

    def __init__(self, cfg: GraniteSWAConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.rotary_emb = LayerRotaryEmbeddings(cfg, max_len)


class GraniteSWAForCausalLM(GraniteForCausalLM):
    """Granite SWA for causal LM: Granite's contract (logits / logits_scaling) over
    GraniteSWAModel; tensor parallelism as Granite's, each rank with its heads' sinks."""

    model_cls = GraniteSWAModel
    config_cls = GraniteSWAConfig
    # transformers' GraniteSWAConfig defaults
    hf_defaults = {"sliding_window": 128, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 8192, "num_key_value_heads": 4}
    # the window is layer_types'; attention_bias biases o_proj too
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "qkv_bias",
                            "o_proj_bias")
