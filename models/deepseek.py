"""DeepSeek-V2 and -V3 (DeepseekV2/V3ForCausalLM; also Kimi-K2, Moonlight): multi-head latent
attention (MLA) in its expanded form (per-head K/V made from the latent each step), dense first
layers then MoE layers with a shared expert; V2 routes by softmax (greedy or group-limited),
V3 by grouped sigmoid scores with a correction bias (models/glm4_moe.py's block)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.glm4_moe import (
    UNREAD_MOE_KEYS,
    Glm4MoeForCausalLM,
    GroupedTopkMoeBlock,
    SharedExpertMoeConfig,
    SharedExpertMoeDecoderLayer,
)
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaModel
from compiled_llm.models.moe_routing import grouped_topk
from compiled_llm.models.rotary import apply_rotary, apply_rotary_interleaved

MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with its default


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's mscale, 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass
class DeepseekConfig(SharedExpertMoeConfig):
    """SharedExpertMoeConfig plus MLA's ranks and head dims. head_dim is the padded dim the
    attention op and the KV cache see (the next power of two over the q/k and v head dims);
    num_key_value_heads is num_attention_heads (MLA expands K/V to every head)."""

    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    topk_method: str = "noaux_tc"  # V2's router; V3's transformers class never reads it
    rope_interleave: bool = True

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) ** 2 for a scaled
        rope with mscale_all_dim (transformers' yarn_apply_mscale)."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        scaling, m_all = self.rope_scaling, self.rope_scaling.get("mscale_all_dim")
        if scaling.get("rope_type", "default") != "default" and m_all:
            scale *= yarn_mscale(scaling["factor"], m_all) ** 2
        return scale

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DeepseekConfig:
        """SharedExpertMoeConfig.from_hf plus the MLA keys; ValueError naming a field the
        engine cannot follow."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        base = super().from_hf(hf_config, **defaults)
        heads = base.num_attention_heads
        if base.num_key_value_heads != heads:  # transformers' attention breaks on it too
            raise ValueError(f"num_key_value_heads {base.num_key_value_heads} is not supported "
                             f"for MLA: give num_attention_heads ({heads})")
        if get("mlp_bias"):  # transformers' V2 biases the shared expert too; no checkpoint does
            raise ValueError("mlp_bias true is not supported for DeepSeek MLA models")
        dims = {key: get(key) for key in MLA_KEYS}
        qk_dim = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]
        padded = 1 << (max(qk_dim, dims["v_head_dim"]) - 1).bit_length()
        return dataclasses.replace(base, **dims, head_dim=padded, num_key_value_heads=heads,
                                   topk_method=get("topk_method") or "greedy",
                                   rope_interleave=bool(get("rope_interleave")))


@dataclasses.dataclass
class DeepseekV2Config(DeepseekConfig):
    """DeepseekConfig whose softmax router transformers' V2 can run as the engine does."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DeepseekV2Config:
        """DeepseekConfig.from_hf; ValueError for a topk_method V2 lacks, or a top_k above the
        kept groups' experts (transformers would then pick masked experts at weight 0)."""
        cfg = super().from_hf(hf_config, **defaults)
        if cfg.topk_method not in V2_TOPK_METHODS:
            raise ValueError(f"topk_method {cfg.topk_method!r} is not supported for "
                             f"DeepseekV2ForCausalLM; have {list(V2_TOPK_METHODS)}")
        kept = cfg.topk_group * cfg.moe.num_experts // cfg.n_group
        if cfg.topk_method == "group_limited_greedy" and cfg.moe.num_experts_per_tok > kept:
            raise ValueError(f"num_experts_per_tok {cfg.moe.num_experts_per_tok} is not "
                             f"supported above the {kept} experts of topk_group groups")
        return cfg


class MlaAttention(nn.Module):
    """DeepSeek's MLA, expanded: q from q_proj (or q_a_proj -> q_a_layernorm -> q_b_proj),
    kv_a_proj_with_mqa -> a latent (normed, then kv_b_proj to per-head k_nope and v) and one
    shared k_pe head; RoPE on the q_pe / k_pe dims. q, k and v are zero-padded to head_dim for
    the attention op (zeros change no dot product) and the output sliced back. The cache thus
    holds full per-head K and V at the padded dim, far more than the latent (kv_lora_rank +
    qk_rope_head_dim a token): a latent cache with absorbed projections is the later step."""

    def __init__(self, cfg: DeepseekConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads = layer_idx, cfg.num_attention_heads
        self.head_dim, self.scale, self.sliding_window = cfg.head_dim, cfg.softmax_scale, -1
        self.nope_dim, self.rope_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.v_dim, self.kv_lora_rank = cfg.v_head_dim, cfg.kv_lora_rank
        self.q_lora = cfg.q_lora_rank is not None
        q_size = self.num_heads * (self.nope_dim + self.rope_dim)
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        if not self.q_lora:
            self.q_proj = nn.Linear(hidden, q_size, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_size, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank,
                                   self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, hidden, bias=bias)
        # V2 (complex product) and V3 with rope_interleave turn pairs (0, 1), (2, 3), ...; V3
        # lays the result out de-interleaved, the same permutation on q and k: equal scores
        self.rotate = apply_rotary_interleaved if cfg.rope_interleave else apply_rotary

    def query(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> q [T, H, qk_head_dim]."""
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        else:
            q = self.q_proj(hidden)
        return q.view(-1, self.num_heads, self.nope_dim + self.rope_dim)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's padded K/V into the cache."""
        q_nope, q_pe = self.query(hidden).split([self.nope_dim, self.rope_dim], -1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora_rank, self.rope_dim],
                                                             -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(-1, self.num_heads,
                                                               self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], -1)
        q_pe, k_pe = self.rotate(q_pe, k_pe.unsqueeze(1), rope)  # k_pe: one head [T, 1, R]
        q = torch.cat([q_nope, q_pe], -1)
        k = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1)], -1)
        pad = self.head_dim - q.shape[-1]
        q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))
        v = F.pad(v, (0, self.head_dim - self.v_dim))
        out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        return self.o_proj(out[..., : self.v_dim].reshape(-1, self.num_heads * self.v_dim))


class DeepseekV2MoeBlock(GroupedTopkMoeBlock):
    """The shared-expert MoE block with DeepSeek-V2's router: softmax scores, the top-k of
    all experts (greedy) or of the topk_group best groups by their best expert
    (group_limited_greedy), never renormalised, times routed_scaling_factor."""

    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__(cfg)
        self.gate.e_score_correction_bias = None  # V2's router has none
        if cfg.topk_method == "greedy":
            self.groups = (1, 1, cfg.routed_scaling_factor)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        groups, topk_group, scale = self.groups
        return grouped_topk(router_logits, self.top_k, groups, topk_group, False, "softmax",
                            None, scale)


class DeepseekV3DecoderLayer(SharedExpertMoeDecoderLayer):
    """The shared-expert MoE layer (dense on the first first_k_dense_replace) with MLA."""

    attention_cls = MlaAttention


class DeepseekV2DecoderLayer(DeepseekV3DecoderLayer):
    """DeepseekV3DecoderLayer with V2's softmax router."""

    moe_cls = DeepseekV2MoeBlock


class DeepseekV3Model(LlamaModel):
    """The Llama body over MLA layers; its rotary table spans qk_rope_head_dim alone."""

    layer_cls = DeepseekV3DecoderLayer

    @staticmethod
    def rotary_config(cfg: DeepseekConfig) -> DeepseekConfig:
        """cfg with head_dim qk_rope_head_dim (transformers' head_dim for its rope)."""
        return dataclasses.replace(cfg, head_dim=cfg.qk_rope_head_dim)


class DeepseekV2Model(DeepseekV3Model):
    """DeepseekV3Model over V2's layers."""

    layer_cls = DeepseekV2DecoderLayer


# transformers' keys both classes share, with their defaults
_COMMON_DEFAULTS = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
                    "attention_bias": False, "mlp_bias": False}


class DeepseekV3ForCausalLM(Glm4MoeForCausalLM):
    """DeepSeek-V3 for causal LM; the multi-token-prediction layer (index num_hidden_layers)
    is skipped. MLA's projections fit no tensor-parallel split of the engine's: refused by
    name; LoRA is refused for MoE models."""

    model_cls = DeepseekV3Model
    config_cls = DeepseekConfig
    supports_tensor_parallel = False
    hf_defaults = {**_COMMON_DEFAULTS, "n_routed_experts": 256, "n_shared_experts": 1,
                   "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                   "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                   "moe_intermediate_size": 2048, "max_position_embeddings": 4096,
                   "rope_interleave": True}
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias",
                                                 "use_qk_norm", "topk_method")


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V2 (and V2-Lite) for causal LM: V3's with the softmax router, RoPE always on
    interleaved pairs; topk_method other than greedy / group_limited_greedy refused."""

    model_cls = DeepseekV2Model
    config_cls = DeepseekV2Config
    hf_defaults = {**_COMMON_DEFAULTS, "n_routed_experts": 64, "n_shared_experts": 2,
                   "routed_scaling_factor": 1.0, "n_group": None, "topk_group": None,
                   "first_k_dense_replace": 0, "norm_topk_prob": False,
                   "moe_intermediate_size": 1407, "max_position_embeddings": 2048,
                   "topk_method": "greedy", "rope_interleave": True}
    # V2's router never reads norm_topk_prob; its rope always pairs (no rope_interleave)
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "use_qk_norm",
                                                 "norm_topk_prob", "rope_interleave")

