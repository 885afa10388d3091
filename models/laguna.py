"""Laguna (LagunaForCausalLM): pre-norm Llama layers; attention with per-head q/k norms, query
heads per layer, RoPE per layer type (own base and rotated share), windows per layer_types, output
gated by softplus(g_proj(x)) per head or element; dense MLPs per mlp_layer_types, else sigmoid
routed experts (tanh soft-capped logits, selection-only correction bias, renormalised, times
moe_routed_scaling_factor) beside an ungated shared expert."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import grouped_topk
from compiled_llm.models.rotary import RotaryEmbedding, apply_partial_rotary

SLIDING, FULL = "sliding_attention", "full_attention"
ARCH = "LagunaForCausalLM"


def _per_layer(hf: dict[str, Any], key: str, default: list, allowed) -> list:
    """hf[key] (default when unset): one entry per layer, each passing `allowed`; ValueError
    naming the field otherwise."""
    layers, values = hf["num_hidden_layers"], hf.get(key) or default
    if len(values) != layers or not all(map(allowed, values)):
        raise ValueError(f"{key} {values!r} is not supported for {ARCH}: give one valid "
                         f"entry per layer ({layers})")
    return list(values)


def _layer_rope(hf: dict[str, Any], kind: str, head_dim: int) -> tuple[float, int]:
    """(RoPE base, rotated dims of a head) of layer type `kind`: the default rope alone."""
    params = (hf.get("rope_parameters") or {}).get(kind)
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters.{kind} {params!r} is not supported for {ARCH}: "
                         "give a default rope_type with its rope_theta")
    dims = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if dims <= 0 or dims % 2 or "rope_theta" not in params:
        raise ValueError(f"rope_parameters.{kind} {params!r} is not supported for {ARCH}: "
                         "give rope_theta and a partial_rotary_factor turning an even number")
    return float(params["rope_theta"]), dims


@dataclasses.dataclass
class LagunaConfig(DecoderConfig):
    """DecoderConfig plus each layer's query heads, each layer type's (RoPE base, rotated
    dims), the gate's granularity and the router's soft cap and routed scale."""

    heads_per_layer: tuple[int, ...] = ()
    layer_rope: dict[bool, tuple[float, int]] = dataclasses.field(default_factory=dict)
    gate_per_head: bool = True
    router_softcap: float = 0.0
    routed_scaling_factor: float = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> LagunaConfig:
        """transformers' LagunaConfig keys; ValueError naming a field it cannot follow."""
        hf = {**defaults, **hf_config}
        layers, kv_heads = hf["num_hidden_layers"], (hf.get("num_key_value_heads")
                                                      or hf["num_attention_heads"])
        kinds = _per_layer(hf, "layer_types", [FULL] * layers, (SLIDING, FULL).__contains__)
        mlps = _per_layer(hf, "mlp_layer_types", ["dense"] + ["sparse"] * (layers - 1),
                          ("dense", "sparse").__contains__)
        heads = _per_layer(hf, "num_attention_heads_per_layer",
                           [hf["num_attention_heads"]] * layers,
                           lambda n: isinstance(n, int) and n > 0 and n % kv_heads == 0)
        if SLIDING in kinds and not hf.get("sliding_window"):
            raise ValueError(f"sliding_window {hf.get('sliding_window')!r} is not supported "
                             f"for {ARCH} with sliding_attention layers: give a window")
        if hf.get("moe_apply_router_weight_on_input"):
            raise ValueError(f"moe_apply_router_weight_on_input True is not supported for "
                             f"{ARCH} (transformers refuses it too)")
        if hf.get("gating", True) not in (True, False, "per-head", "per-element"):
            raise ValueError(f"gating {hf['gating']!r} is not supported for {ARCH}: give "
                             "True, 'per-head' or 'per-element'")
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        layer_rope = {kind == SLIDING: _layer_rope(hf, kind, head_dim)
                      for kind in (FULL, SLIDING) if kind in kinds}
        base = super().from_hf({
            **hf_config, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
            "norm_topk_prob": True,
            "mlp_only_layers": [i for i, kind in enumerate(mlps) if kind == "dense"]},
            **defaults)
        return dataclasses.replace(
            base, heads_per_layer=tuple(heads), layer_rope=layer_rope,
            gate_per_head=hf.get("gating", True) in (True, "per-head"),
            router_softcap=float(hf.get("moe_router_logit_softcapping") or 0.0),
            routed_scaling_factor=float(hf.get("moe_routed_scaling_factor", 1.0)))


class LagunaAttention(LlamaAttention):
    """LlamaAttention with this layer's query heads, per-head q_norm/k_norm, RoPE on the
    leading rotary dims its layer type turns, and softplus(g_proj(x)) gating each head (or
    each element) before o_proj."""

    def __init__(self, cfg: LagunaConfig, layer_idx: int) -> None:
        heads = cfg.heads_per_layer[layer_idx]
        super().__init__(dataclasses.replace(cfg, num_attention_heads=heads), layer_idx)
        self.sliding = self.sliding_window > 0
        self.rotary_dim = cfg.layer_rope[self.sliding][1]
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.gate_per_head = cfg.gate_per_head
        gates = heads if cfg.gate_per_head else heads * cfg.head_dim
        self.g_proj = nn.Linear(cfg.hidden_size, gates, bias=False)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D], each head normalised over D."""
        return self.q_norm(q), self.k_norm(k)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE (the layer type's table) on the leading rotary_dim dims of each head."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(*self.qk_norm(q, k), rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        gate = F.softplus(self.g_proj(hidden).float()).to(attn_out.dtype)  # [T, H or H*D]
        if self.gate_per_head:
            return self.o_proj((attn_out * gate.unsqueeze(-1)).flatten(1))  # [T, H*D]
        return self.o_proj(attn_out.flatten(1) * gate)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by this layer's own query heads (q_proj's and g_proj's rows,
        o_proj's columns) over the sharder's KV heads (k_proj / v_proj rows); the per-head
        q/k norms whole."""
        dim, heads = self.head_dim, sharder.heads
        first, count = sharder.split(self.num_heads, "num_attention_heads_per_layer")
        sharder.column(f"{prefix}.q_proj", self.q_proj, first * dim, count * dim)
        for name in ("k_proj", "v_proj"):
            sharder.column(f"{prefix}.{name}", getattr(self, name), heads.first_kv_head * dim,
                           heads.num_kv_heads * dim)
        gate = 1 if self.gate_per_head else dim  # g_proj rows a head
        sharder.column(f"{prefix}.g_proj", self.g_proj, first * gate, count * gate)
        sharder.row(f"{prefix}.o_proj", self.o_proj, first * dim, count * dim)
        self.num_heads, self.num_kv_heads = count, heads.num_kv_heads


class LagunaMoE(SparseMoeBlock):
    """Router logits (float32, tanh soft-capped where set) -> sigmoid scores; the top-k of
    scores + e_score_correction_bias chosen, weighed by their scores renormalised times
    routed_scaling_factor; the ungated shared expert added."""

    def __init__(self, cfg: LagunaConfig) -> None:
        super().__init__(cfg)
        self.shared_expert_gate = None
        self.softcap, self.scale = cfg.router_softcap, cfg.routed_scaling_factor
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.moe.num_experts),
                                                    requires_grad=False)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        logits = router_logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return grouped_topk(logits, self.top_k, 1, 1, True, "sigmoid",
                            self.e_score_correction_bias, self.scale)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)


class LagunaDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with LagunaAttention and a dense MLP or LagunaMoE (built once)."""

    attention_cls = LagunaAttention

    def __init__(self, cfg: LagunaConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)
        self.self_attn = LagunaAttention(cfg, layer_idx)
        self.sliding = self.self_attn.sliding
        self.mlp = (LagunaMoE(cfg) if cfg.moe.is_sparse(layer_idx) else
                    GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LagunaModel(nn.Module):
    """Embedding, the layers with one rotary table per layer type, the final norm."""

    def __init__(self, cfg: LagunaConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LagunaDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_embs = nn.ModuleDict({
            str(sliding): RotaryEmbedding(dataclasses.replace(cfg, head_dim=dims, rope_theta=theta),
                                          max_len)
            for sliding, (theta, dims) in cfg.layer_rope.items()})

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        ropes = {key: table(positions) for key, table in self.rotary_embs.items()}
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, ropes[str(layer.sliding)])
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LagunaForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """Laguna for causal LM: the Llama contract over LagunaModel (tensor parallel by each
    layer's heads). Pipeline parallelism is refused (its body is not LlamaModel's layer loop);
    LoRA is refused for MoE models. Loads transformers' names and the checkpoints'
    (shared_expert, the bias under experts; per-expert tensors, as sharded)."""

    model_cls = LagunaModel
    config_cls = LagunaConfig
    renamed_modules = {".mlp.shared_experts.": ".mlp.shared_expert.",
                       ".mlp.experts.e_score_correction_bias": ".mlp.e_score_correction_bias",
                       ".mlp.gate.e_score_correction_bias": ".mlp.e_score_correction_bias",
                       ".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
                       ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}

    @staticmethod
    def check_tensor_parallel(config: LagunaConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size unless it divides every layer's heads."""
        for heads in config.heads_per_layer:
            if heads % world:
                raise ValueError(f"tensor_parallel_size {world} must divide "
                                 f"num_attention_heads_per_layer {heads}")

    # transformers' LagunaConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "sliding_window": 512, "rms_norm_eps": 1e-6,
                   "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512, "attention_bias": False,
                   "max_position_embeddings": 131072, "num_key_value_heads": 8,
                   "rope_parameters": {
                       FULL: {"rope_type": "default", "rope_theta": 5e5,
                              "partial_rotary_factor": 0.5},
                       SLIDING: {"rope_type": "default", "rope_theta": 1e4}}}
    # transformers' Laguna reads num_experts, num_experts_per_tok, the two widths and the
    # window from layer_types and sliding_window; attention_bias biases o_proj too
    hf_unread = tuple(key for key in MOE_KEYS if key not in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size")) + (
        "use_sliding_window", "max_window_layers", "qkv_bias", "o_proj_bias", "mlp_bias",
        "partial_rotary_factor", "rope_theta", "rope_scaling")
