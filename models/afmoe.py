"""AFMoE (AfmoeForCausalLM: Arcee's Trinity): norms before and after attention and after the
MLP, each scaled in float32 and cast after; per-head q/k norms, RoPE on the sliding layers alone
(full layers are NoPE), attention output gated by sigmoid(gate_proj(x)); dense MLPs on the first
num_dense_layers layers, then sigmoid-routed experts (expert_bias steers selection alone, weights
renormalised, times route_scale) beside ungated shared experts; optional muP embedding scale."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.heads_tp import shard_heads
from compiled_llm.models.layers import Float32ScaleRMSNorm, GatedMLP
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import grouped_topk
from compiled_llm.models.rotary import RotaryEmbedding

SLIDING, FULL = "sliding_attention", "full_attention"
ARCH = "AfmoeForCausalLM"


def _count(hf: dict[str, Any], key: str, least: int) -> int:
    """hf[key], an int of at least `least`; ValueError naming the field otherwise (transformers
    fails on it mid-build)."""
    value = hf.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{key} {value!r} is not supported for {ARCH}: give an int >= {least}")
    return value


def _layer_types(hf: dict[str, Any]) -> list[str]:
    """layer_types as saved, else transformers' rule: every global_attn_every_n_layers-th layer
    full, the others sliding; ValueError naming the field when it is not one per layer."""
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types")
    if not kinds:
        every = _count(hf, "global_attn_every_n_layers", 1)
        kinds = [FULL if (i + 1) % every == 0 else SLIDING for i in range(layers)]
    if len(kinds) != layers or not set(kinds) <= {SLIDING, FULL}:
        raise ValueError(f"layer_types {kinds!r} is not supported for {ARCH}: give "
                         f"{layers} of {[SLIDING, FULL]}")
    if SLIDING in kinds and not hf.get("sliding_window"):
        raise ValueError(f"sliding_window {hf.get('sliding_window')!r} is not supported for "
                         f"{ARCH} with sliding_attention layers: give a window")
    return list(kinds)


@dataclasses.dataclass
class AfmoeConfig(DecoderConfig):
    """DecoderConfig plus muP's embedding scale and the routed weights' scale; cfg.moe holds
    the experts, the shared experts (num_shared_experts * moe_intermediate_size wide) and the
    dense layers."""

    mup_enabled: bool = False
    route_scale: float = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> AfmoeConfig:
        """transformers' AfmoeConfig keys; ValueError naming a field it cannot build from."""
        hf = {**defaults, **hf_config}
        kinds = _layer_types(hf)
        experts, dense = _count(hf, "num_experts", 1), _count(hf, "num_dense_layers", 0)
        shared = _count(hf, "num_shared_experts", 0)
        width = _count(hf, "moe_intermediate_size", 1)
        if not 1 <= (hf.get("num_experts_per_tok") or 0) <= experts:
            raise ValueError(f"num_experts_per_tok {hf.get('num_experts_per_tok')!r} is not "
                             f"supported for {ARCH}: give 1 to num_experts ({experts})")
        if not isinstance(hf.get("route_scale"), (int, float)):
            raise ValueError(f"route_scale {hf.get('route_scale')!r} is not supported for "
                             f"{ARCH}: give a number")
        base = super().from_hf({
            **hf_config, "layer_types": kinds, "num_experts": experts, "norm_topk_prob": True,
            "mlp_only_layers": list(range(dense)),
            "shared_expert_intermediate_size": width * shared},
            **defaults)
        return dataclasses.replace(base, mup_enabled=bool(hf.get("mup_enabled")),
                                   route_scale=float(hf["route_scale"]))


def afmoe_norm(dim: int, eps: float) -> Float32ScaleRMSNorm:
    """AFMoE's RMSNorm: weight times the float32 normed input, cast after."""
    return Float32ScaleRMSNorm(dim, eps)


class AfmoeAttention(LlamaAttention):
    """LlamaAttention with per-head q_norm/k_norm, RoPE on sliding layers only, and the output
    gated by sigmoid(gate_proj(x)) before o_proj."""

    def __init__(self, cfg: AfmoeConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_rope = self.sliding_window > 0
        self.q_norm = afmoe_norm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = afmoe_norm(cfg.head_dim, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D], each head normalised over D."""
        return self.q_norm(q), self.k_norm(k)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on a sliding layer's q and k; a full layer's stay unrotated (NoPE)."""
        return super().rotate(q, k, rope) if self.use_rope else (q, k)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(*self.qk_norm(q, k), rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        gated = attn_out.flatten(1) * torch.sigmoid(self.gate_proj(hidden))  # [T, H*D]
        return self.o_proj(gated)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """This rank's heads: q/k/v rows, gate_proj's rows with them, o_proj's columns."""
        shard_heads(sharder, prefix, self, self.head_dim, self.head_dim, gates=("gate_proj",))


class AfmoeMoE(SparseMoeBlock):
    """The router's logits (in the model's dtype) -> sigmoid scores; the top-k of scores +
    expert_bias chosen, weighed by their scores renormalised times route_scale; ungated shared
    experts added. expert_bias stays float32 in any model dtype, as transformers 5.25 keeps it."""

    float32_params = ("expert_bias",)

    def __init__(self, cfg: AfmoeConfig) -> None:
        super().__init__(cfg)
        self.shared_expert_gate = None
        self.route_scale = cfg.route_scale
        self.expert_bias = nn.Parameter(torch.zeros(cfg.moe.num_experts), requires_grad=False)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        # transformers divides by the top-k sum + 1e-20
        return grouped_topk(router_logits, self.top_k, 1, 1, True, "sigmoid", self.expert_bias,
                            self.route_scale, 1e-20)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)


class AfmoeDecoderLayer(nn.Module):
    """Norm, attention, norm, residual add; norm, MLP (experts or dense), norm, residual add."""

    def __init__(self, cfg: AfmoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = AfmoeAttention(cfg, layer_idx)
        self.mlp = (AfmoeMoE(cfg) if cfg.moe.is_sparse(layer_idx) else
                    GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act))
        for name in ("input_layernorm", "post_attention_layernorm", "pre_mlp_layernorm",
                     "post_mlp_layernorm"):
            setattr(self, name, afmoe_norm(cfg.hidden_size, cfg.rms_norm_eps))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        attn = self.self_attn(self.input_layernorm(hidden), rope)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_mlp_layernorm(hidden))
        return hidden + self.post_mlp_layernorm(mlp)


class AfmoeModel(nn.Module):
    """Embedding (times sqrt(hidden_size) where mup_enabled), the layers on one rotary table,
    the final norm."""

    def __init__(self, cfg: AfmoeConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_scale = cfg.hidden_size**0.5 if cfg.mup_enabled else None
        self.layers = nn.ModuleList(AfmoeDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = afmoe_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        if self.embed_scale is not None:  # a Python float, as transformers multiplies
            hidden = hidden * self.embed_scale
        rope = self.rotary_emb(positions)
        for layer in self.layers:
            hidden = layer(hidden, rope)
        return self.norm(hidden)


class AfmoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """AFMoE for causal LM: the Llama contract over AfmoeModel. Tensor parallelism splits the
    attention gate's rows with the heads; pipeline parallelism is refused by name (its body is
    not LlamaModel's layer loop); LoRA is refused for MoE models."""

    model_cls = AfmoeModel
    config_cls = AfmoeConfig
    renamed_modules = {".mlp.router.gate.": ".mlp.gate.",
                       ".mlp.shared_experts.": ".mlp.shared_expert.",
                       ".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
                       ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}
    # transformers' AfmoeConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_dense_layers": 1, "num_experts": 64,
                   "num_experts_per_tok": 6, "num_shared_experts": 2, "route_scale": 1.0,
                   "global_attn_every_n_layers": 4, "sliding_window": 1024,
                   "mup_enabled": False, "rms_norm_eps": 1e-5, "moe_intermediate_size": 1408,
                   "max_position_embeddings": 16384, "attention_bias": False}
    # transformers' Afmoe reads num_experts, num_experts_per_tok, moe_intermediate_size, the
    # window from layer_types and sliding_window; attention_bias biases o_proj too
    hf_unread = tuple(key for key in MOE_KEYS if key not in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size")) + (
        "use_sliding_window", "max_window_layers", "qkv_bias", "o_proj_bias", "mlp_bias")
