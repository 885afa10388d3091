"""MiniCPM3 (MiniCPM3ForCausalLM): MLA (models/mla.py, rotate-half RoPE) in a dense Llama layer,
with MiniCPM's scalars in Granite's places (models/granite.py): embeddings times scale_emb,
each attention and MLP output times scale_depth / sqrt(num_hidden_layers) before its residual
add, logits divided by hidden_size / dim_model_base."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.granite import GraniteForCausalLM, GraniteMLP, GraniteModel
from compiled_llm.models.llama import LlamaDecoderLayer
from compiled_llm.models.mla import MlaAttention, MlaConfig, MlaModel


@dataclasses.dataclass
class MiniCPM3Config(MlaConfig):
    """MlaConfig plus MiniCPM's scalars under Granite's names: embedding_multiplier
    (scale_emb), residual_multiplier (scale_depth / sqrt(num_hidden_layers), of the whole
    model, whatever a pipeline stage holds) and logits_scaling (hidden_size / dim_model_base)."""

    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MiniCPM3Config:
        """MlaConfig.from_hf with transformers' fallbacks for a null v_head_dim (hidden_size /
        num_attention_heads), scale_depth (no residual scale) and dim_model_base (hidden_size)."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        hidden, layers = hf_config["hidden_size"], hf_config["num_hidden_layers"]
        v_head_dim = get("v_head_dim") or hidden // hf_config["num_attention_heads"]
        cfg = super().from_hf({**hf_config, "v_head_dim": v_head_dim}, **defaults)
        depth = get("scale_depth")
        return dataclasses.replace(
            cfg, embedding_multiplier=float(get("scale_emb")),
            residual_multiplier=1.0 if depth is None else depth / math.sqrt(layers),
            logits_scaling=hidden / (get("dim_model_base") or hidden))


class MiniCPM3Attention(MlaAttention):
    """MlaAttention whose output is times residual_multiplier."""

    def __init__(self, cfg: MiniCPM3Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden], scaled for the residual add."""
        return super().forward(hidden, rope) * self.residual_multiplier


class MiniCPM3DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with MiniCPM3Attention and Granite's scaled GatedMLP."""

    attention_cls = MiniCPM3Attention

    def __init__(self, cfg: MiniCPM3Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = GraniteMLP(cfg)


class MiniCPM3Model(GraniteModel, MlaModel):
    """Granite's body (scaled embeddings) over MiniCPM3 layers, its rotary table MLA's."""

    layer_cls = MiniCPM3DecoderLayer


class MiniCPM3ForCausalLM(GraniteForCausalLM):
    """MiniCPM3 for causal LM (logits / logits_scaling, Granite's). Tensor parallelism splits
    MLA by heads (MlaAttention.shard_for_tp); MLA's projections fit none of LoRA's Llama
    targets."""

    model_cls = MiniCPM3Model
    config_cls = MiniCPM3Config
    # transformers' MiniCPM3Config defaults (openbmb/MiniCPM3-4B's)
    hf_defaults = {"kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                   "qk_rope_head_dim": 32, "v_head_dim": None, "scale_emb": 12,
                   "scale_depth": 1.4, "dim_model_base": 256, "rms_norm_eps": 1e-5,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768,
                   "num_key_value_heads": 40, "attention_bias": False, "mlp_bias": False,
                   "rope_interleave": False}
    # no window, no experts; RoPE always rotate-half (no rope_interleave)
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "rope_interleave")
