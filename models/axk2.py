"""A.X-K2 (AXK2ForCausalLM): DeepSeek-V3.2's layer served within index_topk (models/deepseek_v32.py:
the indexer keeps every visible key there, so its weights are skipped) with A.X-K2's pieces: one
q_b_proj reading [q latent normed, q latent raw] that makes each head's query and a sigmoid gate
on its attention output, input norms (and a MoE layer's post-attention norm) gated by a low-rank
MLP of their output, and a sigmoid router grouped only where n_group is set."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.axk1 import axk_mlp_layer_types
from compiled_llm.models.deepseek import DeepseekV3DecoderLayer, DeepseekV3Model
from compiled_llm.models.deepseek_v32 import DeepseekV32Config, DeepseekV32ForCausalLM
from compiled_llm.models.glm4_moe import GroupedTopkMoeBlock
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.mla import MlaAttention


@dataclasses.dataclass
class AXK2Config(DeepseekV32Config):
    """DeepseekV32Config plus gated_norm_rank, the gated norms' MLP width."""

    gated_norm_rank: int = 16

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> AXK2Config:
        """DeepseekV32Config.from_hf over axk_mlp_layer_types; ValueError for n_group and
        topk_group not set together (transformers refuses it too) or groups of one expert
        (its group score sums each group's best two)."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        groups, topk_group = get("n_group"), get("topk_group")
        if (groups is None) != (topk_group is None):
            raise ValueError(f"n_group {groups!r} / topk_group {topk_group!r} is not supported "
                             "for AXK2ForCausalLM: set both, or neither (ungrouped routing)")
        if groups and get("n_routed_experts") // groups < 2:
            raise ValueError(f"n_group {groups!r} is not supported for AXK2ForCausalLM: each "
                             "group needs two experts (a group scores by its best two)")
        cfg = super().from_hf({**hf_config, "mlp_layer_types": axk_mlp_layer_types(hf_config)},
                              **defaults)
        return dataclasses.replace(cfg, gated_norm_rank=get("gated_norm_rank"))


class GatedRMSNorm(nn.Module):
    """RMSNorm (`norm`) whose output y is gated, y * sigmoid(W_up(silu(W_down(y)))) (the gate
    in float32); called with a residual it adds first, as RMSNorm does."""

    def __init__(self, cfg: AXK2Config) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.W_down = nn.Linear(cfg.hidden_size, cfg.gated_norm_rank, bias=False)
        self.W_up = nn.Linear(cfg.gated_norm_rank, cfg.hidden_size, bias=False)

    def gated(self, normed: torch.Tensor) -> torch.Tensor:
        """normed [T, hidden] times its gate."""
        gate = torch.sigmoid(self.W_up(F.silu(self.W_down(normed))).float())
        return (normed * gate).to(normed.dtype)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None):
        """gated norm(hidden), or (gated norm(hidden + residual), hidden + residual)."""
        if residual is None:
            return self.gated(self.norm(hidden))
        normed, residual = self.norm(hidden, residual)
        return self.gated(normed), residual


class AXK2Attention(MlaAttention):
    """MlaAttention (q latent, interleaved RoPE) whose q_b_proj reads the q latent normed and
    raw side by side and makes per head the query and a gate (v_head_dim wide): the head's
    attention output is times sigmoid(gate) before o_proj."""

    def __init__(self, cfg: AXK2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_b_proj = nn.Linear(2 * cfg.q_lora_rank, self.num_heads * (
            self.nope_dim + self.rope_dim + self.v_dim), bias=False)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's padded K/V into the cache."""
        latent = self.q_a_proj(hidden)
        q_gate = self.q_b_proj(torch.cat([self.q_a_layernorm(latent), latent], -1))
        q_gate = q_gate.view(-1, self.num_heads, self.nope_dim + self.rope_dim + self.v_dim)
        q, gate = q_gate.split([self.nope_dim + self.rope_dim, self.v_dim], -1)
        out = self.attend(q, hidden, rope)  # [T, H, v_head_dim]
        out = (out * torch.sigmoid(gate.float())).to(out.dtype)
        return self.o_proj(out.reshape(-1, self.num_heads * self.v_dim))


class AXK2MoeBlock(GroupedTopkMoeBlock):
    """The shared-expert MoE block with A.X-K2's router: sigmoid scores + the correction bias
    select; with n_group, the experts outside the topk_group best groups (by their best two)
    are masked to 0.0 (transformers' value, not -inf), so a kept expert whose biased score is
    below 0 can lose to them. Weights: the plain scores, renormalised, times the scale."""

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        groups, topk_group, scale = self.groups
        scores = torch.sigmoid(router_logits.float())
        choice = scores + self.gate.e_score_correction_bias.float()
        if groups > 1:
            grouped = choice.view(choice.shape[0], groups, -1)  # [T, G, E/G]
            best = grouped.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices
            kept = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
            kept = kept.repeat_interleave(grouped.shape[-1], dim=-1)  # [T, E]
            choice = choice.masked_fill(~kept, 0.0)
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * scale, ids


class AXK2DecoderLayer(DeepseekV3DecoderLayer):
    """DeepSeek-V3.2's layer with AXK2Attention and the A.X-K2 router; the input norm gated,
    and a MoE layer's post-attention norm too."""

    attention_cls = AXK2Attention
    moe_cls = AXK2MoeBlock

    def __init__(self, cfg: AXK2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.input_layernorm = GatedRMSNorm(cfg)
        if cfg.moe.is_sparse(layer_idx):
            self.post_attention_layernorm = GatedRMSNorm(cfg)


class AXK2Model(DeepseekV3Model):
    """DeepSeek-V3's body over A.X-K2's layers."""

    layer_cls = AXK2DecoderLayer


class AXK2ForCausalLM(DeepseekV32ForCausalLM):
    """A.X-K2 for causal LM within index_topk tokens (max_model_len capped there); the
    indexer's and the multi-token-prediction layers' tensors are skipped. Tensor parallelism
    shards MLA by heads (q_b_proj's query and gate rows per head); LoRA is refused for MoE
    models."""

    model_cls = AXK2Model
    config_cls = AXK2Config
    # transformers' AXK2Config defaults
    hf_defaults = {"kv_lora_rank": 128, "q_lora_rank": 384, "qk_nope_head_dim": 64,
                   "qk_rope_head_dim": 32, "v_head_dim": 64, "rms_norm_eps": 1e-6,
                   "attention_bias": False, "n_routed_experts": 128, "n_shared_experts": 1,
                   "routed_scaling_factor": 2.5, "n_group": None, "topk_group": None,
                   "num_experts_per_tok": 8, "norm_topk_prob": True,
                   "moe_intermediate_size": 512, "max_position_embeddings": 131072,
                   "num_key_value_heads": 32, "rope_interleave": True, "index_topk": 2048,
                   "gated_norm_rank": 16}
