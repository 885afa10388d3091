"""Gemma4Config: transformers' Gemma4TextConfig read into per-layer shapes (wider global layers,
their KV heads), the layers that read an earlier layer's KV cache, per-layer input embeddings
(PLE) and the MoE block's experts; whatever the released checkpoints' keys ask for that the
engine cannot follow is refused by name."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.config import DecoderConfig, MoeConfig
from compiled_llm.models.gemma3 import FULL, SLIDING, split_layer_rope

# transformers' tanh-approximated GELU spellings -> the fused MoE op's activation
MOE_ACTIVATIONS = {**dict.fromkeys(("gelu_pytorch_tanh", "gelu_new", "gelu_fast",
                                    "gelu_python_tanh", "gelu_accurate"), "gelu_tanh"),
                   "silu": "silu", "swish": "silu"}
# Gemma4TextConfig's defaults for the proportional RoPE of the full layers, the default of the
# sliding ones
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1_000_000.0}}


@dataclasses.dataclass
class Gemma4Config(DecoderConfig):
    """DecoderConfig (head_dim and num_key_value_heads: the sliding layers') plus Gemma 4's keys;
    rope_theta / rope_scaling are the full layers', local_rope_theta the sliding layers'."""

    local_rope_theta: float = 10000.0
    final_logit_softcapping: float | None = None
    global_head_dim: int = 512
    global_kv_heads: int = 4
    attention_k_eq_v: bool = False  # full layers: the key projection is the values too
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False  # KV-shared layers' MLPs twice intermediate_size
    hidden_size_per_layer_input: int = 0  # 0: no per-layer input embeddings
    vocab_size_per_layer_input: int = 0
    moe_activation: str = "gelu_tanh"

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Gemma4Config:
        """Gemma4TextConfig's keys: layer_types (the last layer full, as transformers forces
        it), global_head_dim / num_global_key_value_heads or per_layer_config, per-type
        rope_parameters, and the MoE block's num_experts / top_k_experts."""
        hf = {**defaults, **hf_config}
        if hf.get("use_bidirectional_attention") == "all":
            raise ValueError("use_bidirectional_attention='all' (bidirectional attention) is "
                             "not supported")
        num_layers = hf["num_hidden_layers"]
        types = list(hf.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL
                                               for i in range(num_layers)])
        types[-1] = FULL
        hf["layer_types"] = types
        hf["rope_parameters"] = (hf.get("rope_parameters")
                                 or {kind: dict(params) for kind, params in DEFAULT_ROPE.items()})
        if not set(types) <= set(hf["rope_parameters"]):  # transformers reads it per type
            raise ValueError(f"rope_parameters must hold one dict per layer type "
                             f"{sorted(set(types))}, got keys {sorted(hf['rope_parameters'])}")
        local_theta = split_layer_rope(hf, defaults)
        hf["hidden_act"] = hf.get("hidden_activation") or "gelu_pytorch_tanh"
        experts = {key: hf.pop(key, None)
                   for key in ("num_experts", "top_k_experts", "moe_intermediate_size")}
        base = super().from_hf(hf, **defaults)
        heads, dim = global_shape(hf, base)
        shared = hf.get("num_kv_shared_layers") or 0
        check_kv_sharing(types, shared)
        ple = hf.get("hidden_size_per_layer_input") or 0
        if ple and hf["vocab_size_per_layer_input"] < base.vocab_size:
            raise ValueError(f"vocab_size_per_layer_input {hf['vocab_size_per_layer_input']} "
                             f"below vocab_size {base.vocab_size} is not supported")
        return dataclasses.replace(
            base, local_rope_theta=float(local_theta), global_head_dim=dim,
            global_kv_heads=heads, final_logit_softcapping=hf.get("final_logit_softcapping"),
            attention_k_eq_v=bool(hf.get("attention_k_eq_v")), num_kv_shared_layers=shared,
            use_double_wide_mlp=bool(hf.get("use_double_wide_mlp")),
            hidden_size_per_layer_input=ple,
            vocab_size_per_layer_input=hf.get("vocab_size_per_layer_input") or 0,
            moe=moe_config(hf, experts), moe_activation=moe_activation(hf))

    def is_sliding(self, layer_idx: int) -> bool:
        """Whether layer layer_idx is a sliding_attention one."""
        return layer_idx in (self.sliding_window_layers or ())

    def layer_shape(self, layer_idx: int) -> tuple[int, int]:
        """(KV heads, head dim) of layer layer_idx's attention."""
        if self.is_sliding(layer_idx):
            return self.num_key_value_heads, self.head_dim
        return self.global_kv_heads, self.global_head_dim

    def kv_source(self, layer_idx: int) -> int:
        """The layer whose K/V layer layer_idx attends over: itself, or for a KV-shared layer
        the last earlier layer of its type that writes a cache (transformers' rule)."""
        first_shared = self.num_hidden_layers - self.num_kv_shared_layers
        if layer_idx < first_shared:
            return layer_idx
        sliding = self.is_sliding(layer_idx)
        return max(i for i in range(first_shared) if self.is_sliding(i) == sliding)

    @property
    def kv_cache_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head dim) of each layer's cache (worker/kv_cache.py reads it): none
        (0 heads) for a layer that reads another layer's cache."""
        return tuple((0, self.layer_shape(i)[1]) if self.kv_source(i) != i
                     else self.layer_shape(i) for i in range(self.num_hidden_layers))


def global_shape(hf: dict[str, Any], base: DecoderConfig) -> tuple[int, int]:
    """(KV heads, head dim) of the full layers: from per_layer_config (what transformers
    writes), else global_head_dim and, with attention_k_eq_v, num_global_key_value_heads. Per
    layer overrides must be the same on every full layer and absent on the sliding ones."""
    overrides = hf.get("per_layer_config")
    if overrides is None:
        heads = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        return heads or base.num_key_value_heads, hf.get("global_head_dim") or 512
    shapes = {}
    for idx, layer in overrides.items():
        unknown = set(layer) - {"head_dim", "num_key_value_heads"}
        kind = hf["layer_types"][int(idx)]
        if unknown or (kind == SLIDING and layer):
            raise ValueError(f"per_layer_config[{idx}] {layer!r} is not supported (head_dim "
                             "and num_key_value_heads of the full layers only)")
        shapes[int(idx)] = (layer.get("num_key_value_heads") or base.num_key_value_heads,
                            layer.get("head_dim") or base.head_dim)
    full = {shapes.get(i, (base.num_key_value_heads, base.head_dim))
            for i, kind in enumerate(hf["layer_types"]) if kind == FULL}
    if len(full) != 1:
        raise ValueError(f"per_layer_config: full layers of different shapes {sorted(full)} "
                         "are not supported")
    return full.pop()


def check_kv_sharing(types: list[str], shared: int) -> None:
    """ValueError naming num_kv_shared_layers unless each KV-shared layer's type has an earlier
    layer that writes a cache (transformers 5.25 refuses the same)."""
    first = len(types) - shared
    if shared < 0 or first <= 0 or not set(types[first:]) <= set(types[:first]):
        raise ValueError(f"num_kv_shared_layers {shared} is not supported: each shared layer "
                         "needs an earlier layer of its type that writes a cache")


def moe_config(hf: dict[str, Any], experts: dict[str, Any]) -> MoeConfig | None:
    """The MoE block's experts (softmax top-k, renormalised), or None without enable_moe_block
    (whose num_experts transformers then never reads)."""
    if not hf.get("enable_moe_block"):
        return None
    for key, value in experts.items():
        if not value:
            raise ValueError(f"{key} is required with enable_moe_block")
    return MoeConfig(num_experts=experts["num_experts"],
                     num_experts_per_tok=experts["top_k_experts"],
                     moe_intermediate_size=experts["moe_intermediate_size"], norm_topk_prob=True)


def moe_activation(hf: dict[str, Any]) -> str:
    """The fused MoE op's name of hidden_activation (ValueError where it has none)."""
    if not hf.get("enable_moe_block"):
        return "gelu_tanh"
    if hf["hidden_act"] not in MOE_ACTIVATIONS:
        raise ValueError(f"hidden_activation {hf['hidden_act']!r} is not supported with "
                         f"enable_moe_block; have {sorted(MOE_ACTIVATIONS)}")
    return MOE_ACTIVATIONS[hf["hidden_act"]]
