"""GLM-4 decoders: GlmForCausalLM (glm-4-9b-chat-hf) and Glm4ForCausalLM (GLM-4-0414), the
Llama layout with biased q/k/v (o_proj unbiased), one gate_up_proj MLP, and RoPE on interleaved
pairs of the leading partial_rotary_factor (0.5 by default) of each head; Glm4 also norms each
block's output (post_self_attn_layernorm, post_mlp_layernorm) before its residual add."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.config_fields import hf_rope_dict
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM
from compiled_llm.models.phi3 import Phi3DecoderLayer, Phi3Model
from compiled_llm.models.rotary import (
    PartialRotaryConfig,
    apply_partial_rotary,
    apply_rotary_interleaved,
)


@dataclasses.dataclass
class GlmConfig(DecoderConfig):
    """DecoderConfig whose rotary table covers rotary_dim = head_dim * partial_rotary_factor
    dims (0.5 unless the config says), for every rope type but proportional."""

    rotary_dim = PartialRotaryConfig.rotary_dim
    check_rotary = staticmethod(PartialRotaryConfig.check_rotary)

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GlmConfig:
        """transformers' GlmConfig keys: partial_rotary_factor from rope_parameters, else the
        top level, else 0.5."""
        hf = dict(hf_config)
        params = hf_rope_dict(hf)
        params.setdefault("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5))
        hf.pop("rope_scaling", None)
        hf["rope_parameters"] = params
        return super().from_hf(hf, **defaults)


class GlmAttention(LlamaAttention):
    """LlamaAttention with RoPE on interleaved pairs of the leading rotary_dim dims."""

    def __init__(self, cfg: GlmConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.rotary_dim = cfg.rotary_dim

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on pairs (0, 1), (2, 3), ... of the leading rotary_dim dims of each head."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim, apply_rotary_interleaved)


class GlmDecoderLayer(Phi3DecoderLayer):
    """The Llama layer with GlmAttention and one gate_up_proj MLP."""

    attention_cls = GlmAttention


class Glm4DecoderLayer(GlmDecoderLayer):
    """GlmDecoderLayer whose attention and MLP outputs are normed before their residual add."""

    def __init__(self, cfg: GlmConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (normed MLP output, residual stream without it)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_self_attn_layernorm(self.self_attn(hidden, rope))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.post_mlp_layernorm(self.mlp(hidden)), residual


class GlmModel(Phi3Model):
    """The Llama body with GLM layers, its rotary table over the rotary dims."""

    layer_cls = GlmDecoderLayer


class Glm4Model(Phi3Model):
    """The Llama body with GLM-4-0414 layers, its rotary table over the rotary dims."""

    layer_cls = Glm4DecoderLayer


class GlmForCausalLM(LlamaForCausalLM):
    """GLM-4 for causal LM: the Llama contract over GlmModel. Tensor parallelism shards it as
    Phi-3's gate_up_proj; LoRA is refused by the gate_proj / up_proj it lacks."""

    model_cls = GlmModel
    config_cls = GlmConfig
    # transformers' GlmConfig defaults
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07,
                   "max_position_embeddings": 131072, "attention_bias": True,
                   "o_proj_bias": False, "tie_word_embeddings": False}
    # transformers' GLM never reads these: no window, no experts, o_proj and the MLP unbiased
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")


class Glm4ForCausalLM(GlmForCausalLM):
    """GLM-4-0414 for causal LM: GlmForCausalLM over Glm4Model (post-block norms)."""

    model_cls = Glm4Model
