"""BitNet (BitNetForCausalLM) in its float form: the Llama layer with two sub-norms, attn_sub_norm
on the attention output before o_proj and ffn_sub_norm on the gated MLP's product before
down_proj (its gate activation relu2 unless hidden_act says). Checkpoints quantized BitNet's
way (quantization_config quant_method "bitnet": ternary weights) are refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.tp_helpers import split_rms_norm


@dataclasses.dataclass
class BitNetConfig(DecoderConfig):
    """DecoderConfig, checked for what BitNet's float layers can follow."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> BitNetConfig:
        """DecoderConfig.from_hf; ValueError for BitNet's own quantization (its packed ternary
        weights and weight_scale) or heads that do not span hidden_size (attn_sub_norm is
        hidden_size wide)."""
        method = (hf_config.get("quantization_config") or {}).get("quant_method")
        if method == "bitnet":
            raise ValueError("quantization_config.quant_method 'bitnet' is not supported for "
                             "BitNetForCausalLM: give the float (bf16) checkpoint")
        cfg = super().from_hf(hf_config, **defaults)
        if cfg.num_attention_heads * cfg.head_dim != cfg.hidden_size:
            raise ValueError(f"head_dim {cfg.head_dim} is not supported for BitNetForCausalLM: "
                             f"attn_sub_norm needs num_attention_heads * head_dim = "
                             f"hidden_size {cfg.hidden_size}")
        return cfg


class BitNetAttention(LlamaAttention):
    """LlamaAttention whose output is normed (attn_sub_norm, over all heads) before o_proj."""

    def __init__(self, cfg: BitNetConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.attn_sub_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(q, k, rope)
        out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        return self.o_proj(self.attn_sub_norm(out.flatten(1)))  # [T, H*D] normed

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by heads; attn_sub_norm keeps this rank's heads' weights, its
        mean square summed over the ranks."""
        first, count = sharder.query_heads()
        sharder.attention(prefix, self)
        split_rms_norm(sharder, self, "attn_sub_norm", prefix, first * self.head_dim,
                       count * self.head_dim)


class BitNetMLP(GatedMLP):
    """GatedMLP whose act(gate) * up is normed (ffn_sub_norm) before down_proj."""

    def __init__(self, cfg: BitNetConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)
        self.ffn_sub_norm = RMSNorm(cfg.intermediate_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        product = self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden)
        return self.down_proj(self.ffn_sub_norm(product))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by intermediate rows; ffn_sub_norm keeps this rank's weights,
        its mean square summed over the ranks."""
        start, size = sharder.split(self.down_proj.in_features, "intermediate_size")
        sharder.mlp(prefix, self)
        split_rms_norm(sharder, self, "ffn_sub_norm", prefix, start, size)


class BitNetDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with BitNet's attention and MLP."""

    attention_cls = BitNetAttention

    def __init__(self, cfg: BitNetConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = BitNetMLP(cfg)


class BitNetModel(LlamaModel):
    """The Llama body over BitNet's layers."""

    layer_cls = BitNetDecoderLayer


class BitNetForCausalLM(LlamaForCausalLM):
    """BitNet b1.58 for causal LM, float checkpoints (tensor parallel: the sub-norms over
    what it splits sum their mean squares over the ranks)."""

    model_cls = BitNetModel
    config_cls = BitNetConfig
    # transformers' BitNetConfig defaults
    hf_defaults = {"hidden_act": "relu2", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                   "max_position_embeddings": 2048, "num_key_value_heads": 5,
                   "attention_bias": False, "tie_word_embeddings": False}
    # transformers' BitNet MLP is never biased; o_proj follows attention_bias
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")
