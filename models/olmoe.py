"""OLMoE decoder (OlmoeForCausalLM: OLMoE-1B-7B): the pre-norm Llama body with RMSNorms, q_norm /
k_norm RMSNorms over the whole q and k projections, q/k/v clamped where clip_qkv is set, and a
sparse MoE block in every layer (router `gate`, softmax top-k renormalised per norm_topk_prob;
each expert's gate/up/down_proj, as transformers 5 saves them, stacked into w13 / w2)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap
from compiled_llm.models.olmo import OlmoConfig, clip_qkv
from compiled_llm.models.olmo2 import Olmo2Attention


@dataclasses.dataclass
class OlmoeConfig(OlmoConfig):
    """OlmoConfig whose head_dim must be hidden_size / num_attention_heads (transformers sizes
    q_norm by hidden_size)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> OlmoeConfig:
        """OlmoConfig.from_hf (num_experts, or its alias num_local_experts, 64 if neither);
        ValueError for a head_dim its q_norm would not fit."""
        hf = dict(hf_config)
        hf.setdefault("num_experts", hf.get("num_local_experts") or 64)
        base = super().from_hf(hf, **defaults)
        if base.head_dim * base.num_attention_heads != base.hidden_size:
            raise ValueError(f"head_dim {base.head_dim} is not supported for OlmoeForCausalLM: "
                             "its q_norm is hidden_size wide (head_dim must be hidden_size / "
                             "num_attention_heads)")
        return base


class OlmoeAttention(Olmo2Attention):
    """Olmo2Attention with Llama RMSNorms (cast, then scaled) as q_norm / k_norm, and q, k and
    v clamped to [-clip_qkv, clip_qkv] after them."""

    def __init__(self, cfg: OlmoeConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_norm = RMSNorm(self.num_heads * self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.num_kv_heads * self.head_dim, cfg.rms_norm_eps)
        self.clip_qkv = cfg.clip_qkv

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D]: q and k normed, then all three clamped."""
        return clip_qkv(super().qkv(hidden), self.clip_qkv)


class OlmoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (its MLP the sparse block cfg.moe gives every layer) with
    OlmoeAttention."""

    attention_cls = OlmoeAttention


class OlmoeModel(LlamaModel):
    """The Llama body over OLMoE layers."""

    layer_cls = OlmoeDecoderLayer


class OlmoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """OLMoE for causal LM: the Llama contract over OlmoeModel (pipeline parallelism as
    Llama's). Tensor parallelism is refused by name (its q_norm / k_norm span every head in a
    Llama RMSNorm, which is not sharded); LoRA is refused for MoE models."""

    model_cls = OlmoeModel
    config_cls = OlmoeConfig
    hf_defaults = {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                   "num_experts_per_tok": 8, "norm_topk_prob": False}
    # transformers' Olmoe reads num_experts (num_local_experts its alias), num_experts_per_tok,
    # norm_topk_prob and intermediate_size (per expert) of the MoE keys; no window, o_proj
    # biased as q/k/v
    hf_unread = WINDOW_KEYS + ("moe_intermediate_size", "shared_expert_intermediate_size",
                               "decoder_sparse_step", "mlp_only_layers", "qkv_bias",
                               "o_proj_bias", "mlp_bias")

    @staticmethod
    def check_tensor_parallel(config: OlmoeConfig, world: int) -> None:
        """ValueError naming q_norm / k_norm: they are not sharded."""
        raise ValueError(f"tensor_parallel_size {world}: OlmoeForCausalLM's q_norm / k_norm "
                         "(RMSNorms over every head of q and k) are not sharded (run it with 1)")
