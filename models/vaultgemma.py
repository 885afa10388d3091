"""VaultGemma decoder (VaultGemmaForCausalLM: google/vaultgemma-1b): Gemma 2 with two norms a
layer, (1 + weight) RMSNorms before attention and before the GELU-gated MLP and none after
either; scaled embeddings, query_pre_attn_scalar's scale, sliding and full layers, soft-capped
attention scores (the attention op's softcap) and soft-capped logits as Gemma 2's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.models.gemma2 import Gemma2Attention, Gemma2Config, Gemma2ForCausalLM
from compiled_llm.models.gemma3 import GemmaScaledModel, gemma_rms_norm
from compiled_llm.models.layers import GatedMLP

SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")


class VaultGemmaConfig(Gemma2Config):
    """Gemma2Config whose soft-caps default to VaultGemmaConfig's (an explicit null: none)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> VaultGemmaConfig:
        """transformers' VaultGemmaConfig keys (Gemma 2's, no bidirectional attention)."""
        caps = {key: defaults[key] for key in SOFTCAPS if key in defaults}
        return super().from_hf({**caps, **hf_config}, **defaults)


class VaultGemmaDecoderLayer(nn.Module):
    """Norm, Gemma 2's attention, residual add; norm, GELU-gated MLP, residual add."""

    def __init__(self, cfg: Gemma2Config, layer_idx: int) -> None:
        super().__init__()
        self.sliding = cfg.layer_window(layer_idx) > 0
        self.self_attn = Gemma2Attention(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)
        self.input_layernorm = gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope)
        return hidden + self.mlp(self.pre_feedforward_layernorm(hidden))


class VaultGemmaModel(GemmaScaledModel):
    """The scaled embedding, VaultGemma's layers on one rotary table, the final norm."""

    layer_cls = VaultGemmaDecoderLayer


class VaultGemmaForCausalLM(Gemma2ForCausalLM):
    """VaultGemma for causal LM: Gemma 2's contract (soft-capped logits) over VaultGemmaModel;
    tensor parallelism as Gemma 2's, pipeline parallelism refused by name (its body is not
    LlamaModel's layer loop)."""

    model_cls = VaultGemmaModel
    config_cls = VaultGemmaConfig
    # transformers' VaultGemmaConfig defaults (config.json may leave any of them out)
    hf_defaults = {**Gemma2ForCausalLM.hf_defaults, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0}
    # transformers' VaultGemma has no bidirectional attention (Gemma 2's option)
    hf_unread = Gemma2ForCausalLM.hf_unread + ("use_bidirectional_attention",)
