"""NanoChat decoder (NanoChatForCausalLM: karpathy/nanochat-d32 and kin): the Llama layer loop
with weightless RMSNorms (x / rms(x) in float32; one more on the embeddings, before the
layers), RoPE turned the other way (rotate_half as cat(x2, -x1): sin negated), q and k
RMSNormed per head after RoPE, q/k/v/o biased where attention_bias says, an ungated bias-free
fc1 -> relu2 -> fc2 MLP and logits soft-capped by final_logit_softcapping."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import DenseMLP, RMSNorm, SoftCappedLogits
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import apply_rotary


@dataclasses.dataclass
class NanoChatConfig(DecoderConfig):
    """DecoderConfig plus the logit soft-cap (None: not capped)."""

    final_logit_softcapping: float | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> NanoChatConfig:
        """The Llama keys, then final_logit_softcapping (a positive number or null)."""
        base = super().from_hf(hf_config, **defaults)
        cap = hf_config.get("final_logit_softcapping", defaults.get("final_logit_softcapping"))
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                                or cap <= 0):
            raise ValueError(f"final_logit_softcapping must be a positive number or null, "
                             f"got {cap!r}")
        return dataclasses.replace(base, final_logit_softcapping=cap and float(cap))


class NanoChatRMSNorm(RMSNorm):
    """RMSNorm without a learned weight (transformers' NanoChatRMSNorm): its weight a buffer
    of ones, so the graph is Llama's norm (exact: times one) and the fusion passes see it."""

    def __init__(self, dim: int, eps: float) -> None:
        nn.Module.__init__(self)
        self.register_buffer("weight", torch.ones(dim), persistent=False)
        self.eps = eps


class NanoChatAttention(LlamaAttention):
    """LlamaAttention rotated by the model's (cos, -sin), then q and k normed per head."""

    def __init__(self, cfg: NanoChatConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_norm = NanoChatRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = NanoChatRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """q [T, H, D], k [T, Hkv, D] rotated, then normed over D (transformers' order)."""
        q, k = apply_rotary(q, k, rope)
        return self.q_norm(q), self.k_norm(k)


class NanoChatDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with NanoChatAttention, weightless norms and the fc1 / fc2 MLP."""

    attention_cls = NanoChatAttention

    def __init__(self, cfg: NanoChatConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.input_layernorm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("fc1", "fc2"), bias=False)


class NanoChatModel(LlamaModel):
    """The Llama body over NanoChat layers; its weightless final norm also norms the
    embeddings before the first layer."""

    layer_cls = NanoChatDecoderLayer

    def __init__(self, cfg: NanoChatConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden, residual = self.norm(self.embed_tokens(input_ids)), None  # [T, hidden]
        cos, sin = self.rotary_emb(positions)  # [T, 1, D] each
        rope = (cos, -sin)  # NanoChat's rotate_half is Llama's negated
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, rope)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class NanoChatForCausalLM(SoftCappedLogits, LlamaForCausalLM):
    """NanoChat for causal LM: the Llama contract over NanoChatModel, logits soft-capped where
    final_logit_softcapping is set; tensor parallelism as Llama's (fc1 / fc2 as an ungated MLP).
    Pipeline parallelism (its body norms the embeddings first) is refused by name, and LoRA by
    the gate_proj it lacks."""

    model_cls = NanoChatModel
    config_cls = NanoChatConfig
    # transformers' NanoChatConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "relu2", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
                   "attention_bias": False, "final_logit_softcapping": 15.0,
                   "tie_word_embeddings": False}
    # transformers' NanoChat never reads these: no window, no experts, o_proj biased as
    # q/k/v, the MLP never biased
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")

    def __init__(self, cfg: NanoChatConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.softcap = cfg.final_logit_softcapping
