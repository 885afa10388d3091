"""MiniMax-M2 (MiniMaxM2ForCausalLM): the Llama layer with q_norm / k_norm RMSNorms over the whole
q and k projections (every head at once), rotate-half RoPE on the leading rotary_dim dims of each
head, and a sparse MoE block in every layer: sigmoid router scores, top-k chosen with the
selection-only e_score_correction_bias, renormalised. Checkpoints name the block
`block_sparse_moe` and the experts' gate, down and up projections w1, w2 and w3 (Mixtral's)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import sigmoid_topk
from compiled_llm.models.olmo2 import Olmo2Attention
from compiled_llm.models.phi3 import Phi3Model
from compiled_llm.models.rotary import PartialRotaryConfig, apply_partial_rotary


class MiniMaxM2Config(PartialRotaryConfig):
    """PartialRotaryConfig (its rotary_dim: head_dim * partial_rotary_factor) reading the
    released checkpoints' rotary_dim as transformers does (partial_rotary_factor = rotary_dim /
    head_dim unless given)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MiniMaxM2Config:
        """PartialRotaryConfig.from_hf with rotary_dim read into partial_rotary_factor."""
        hf = dict(hf_config)
        rotary_dim = hf.get("rotary_dim")
        if rotary_dim is not None:
            head_dim = hf.get("head_dim", defaults.get("head_dim"))
            hf.setdefault("partial_rotary_factor", rotary_dim / head_dim)
        return super().from_hf(hf, **defaults)


class MiniMaxM2Attention(Olmo2Attention):
    """LlamaAttention with Llama RMSNorms (cast, then scaled) over the whole q and k
    projections before RoPE, and RoPE on the leading rotary_dim dims of each head."""

    def __init__(self, cfg: MiniMaxM2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_norm = RMSNorm(self.num_heads * self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.num_kv_heads * self.head_dim, cfg.rms_norm_eps)
        self.rotary_dim = cfg.rotary_dim

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Rotate-half RoPE on the leading rotary_dim dims of each head."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim)


class MiniMaxM2MoeBlock(SparseMoeBlock):
    """SparseMoeBlock (router `gate`, no shared expert) with sigmoid top-k routing: scores +
    e_score_correction_bias select, the plain scores weigh, renormalised."""

    def __init__(self, cfg: MiniMaxM2Config) -> None:
        super().__init__(cfg)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.moe.num_experts),
                                                    requires_grad=False)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        return sigmoid_topk(router_logits, self.top_k, self.e_score_correction_bias, True)


class MiniMaxM2DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with MiniMaxM2Attention and the sigmoid-routed MoE block."""

    attention_cls = MiniMaxM2Attention

    def __init__(self, cfg: MiniMaxM2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = MiniMaxM2MoeBlock(cfg)


class MiniMaxM2Model(Phi3Model):
    """The Llama body over MiniMax-M2 layers, its rotary table over the rotary dims."""

    layer_cls = MiniMaxM2DecoderLayer


class MiniMaxM2ForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """MiniMax-M2 for causal LM: the Llama contract over MiniMaxM2Model (pipeline parallelism as
    Llama's). Tensor parallelism is refused by name (its q_norm / k_norm span every head in a
    Llama RMSNorm, which is not sharded); LoRA is refused for MoE models."""

    model_cls = MiniMaxM2Model
    config_cls = MiniMaxM2Config
    # transformers' MiniMaxM2Config defaults
    hf_defaults = {"rope_theta": 5e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 196608,
                   "head_dim": 128, "num_key_value_heads": 8, "num_local_experts": 256,
                   "num_experts_per_tok": 8}
    # it reads num_local_experts (num_experts its alias), num_experts_per_tok and
    # intermediate_size (per expert) of the MoE keys; no window, no biases (its checkpoints'
    # use_qk_norm, scoring_func, use_routing_bias and the like are unread: always on)
    hf_unread = WINDOW_KEYS + ("moe_intermediate_size", "norm_topk_prob",
                               "shared_expert_intermediate_size", "decoder_sparse_step",
                               "mlp_only_layers", "attention_bias", "qkv_bias", "o_proj_bias",
                               "mlp_bias")
    renamed_modules = {".block_sparse_moe.": ".mlp."}
    expert_projs = {"w1": ("w13_weight", 0), "w3": ("w13_weight", 1), "w2": ("w2_weight", 0)}

    @staticmethod
    def check_tensor_parallel(config: MiniMaxM2Config, world: int) -> None:
        """ValueError naming q_norm / k_norm: they are not sharded."""
        raise ValueError(f"tensor_parallel_size {world}: MiniMaxM2ForCausalLM's q_norm / "
                         "k_norm (RMSNorms over every head of q and k) are not sharded (run it "
                         "with 1)")
