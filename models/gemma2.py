"""Gemma 2 decoder (Gemma2ForCausalLM): Gemma 3's layer shape (scaled embeddings, (1 + weight)
norms after attention and around a GELU gate, query_pre_attn_scalar's scale, sliding and full
layers alternating) without q/k norms, on one RoPE table, with soft-capped attention scores
(the attention op's softcap) and soft-capped logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.gemma3 import (
    FULL,
    SLIDING,
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    GemmaScaledModel,
)
from compiled_llm.models.llama import LlamaAttention


@dataclasses.dataclass
class Gemma2Config(DecoderConfig):
    """DecoderConfig plus Gemma 2's scale and soft-caps (None: not capped)."""

    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Gemma2Config:
        """transformers' Gemma2Config keys; configs without layer_types (4.x) alternate
        sliding and full layers, the first sliding."""
        hf = dict(hf_config)
        if hf.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True: bidirectional attention is "
                             "not supported")
        hf["hidden_act"] = hf.get("hidden_activation") or "gelu_pytorch_tanh"
        if not hf.get("layer_types"):
            hf["layer_types"] = [SLIDING if i % 2 == 0 else FULL
                                 for i in range(hf["num_hidden_layers"])]
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 256),
            attn_logit_softcapping=hf.get("attn_logit_softcapping"),
            final_logit_softcapping=hf.get("final_logit_softcapping"))


class Gemma2Attention(LlamaAttention):
    """LlamaAttention scaled by query_pre_attn_scalar, its scores soft-capped where
    attn_logit_softcapping is set (the attention op applies the cap in its kernels)."""

    def __init__(self, cfg: Gemma2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.softcap = float(cfg.attn_logit_softcapping or 0.0)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(q, k, rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window, True,
                             self.softcap)
        return self.o_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]


class Gemma2DecoderLayer(Gemma3DecoderLayer):
    """Gemma 3's layer (four norms) around Gemma2Attention."""

    attention_cls = Gemma2Attention


class Gemma2Model(GemmaScaledModel):
    """The scaled embedding, Gemma 2's layers on one rotary table, the final norm."""

    layer_cls = Gemma2DecoderLayer


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2 for causal LM: Gemma 3's contract (soft-capped logits) over Gemma2Model.
    Tensor parallelism is refused for it by name."""

    model_cls = Gemma2Model
    config_cls = Gemma2Config
    hf_defaults = {"head_dim": 256, "sliding_window": 4096, "tie_word_embeddings": True,
                   "rms_norm_eps": 1e-6, "max_position_embeddings": 8192}
    # transformers' Gemma 2 reads hidden_activation and a window on the sliding layers alone;
    # attention_bias biases o_proj too
    hf_unread = MOE_KEYS + ("hidden_act", "qkv_bias", "o_proj_bias", "mlp_bias",
                            "use_sliding_window", "max_window_layers")
