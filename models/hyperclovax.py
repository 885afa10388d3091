"""HyperCLOVA X decoder (HyperCLOVAXForCausalLM: HyperCLOVAX-SEED-Think-14B): Granite's MuP
scalars with Peri-Layer Normalization (use_post_norm: post_norm1 / post_norm2 RMSNorms on the
attention's and the MLP's outputs, before residual_multiplier), attention scaled by
attention_multiplier (head_dim ** -0.5 unless given) and logits times logits_scaling."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.granite import GraniteConfig, GraniteForCausalLM, GraniteModel
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LlamaAttention, LlamaDecoderLayer


@dataclasses.dataclass
class HyperCLOVAXConfig(GraniteConfig):
    """GraniteConfig plus use_post_norm (transformers' default: on)."""

    use_post_norm: bool = True

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> HyperCLOVAXConfig:
        """Granite's keys; a missing or null attention_multiplier is head_dim ** -0.5."""
        hf = dict(hf_config)
        if hf.get("attention_multiplier") is None:
            head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
            hf["attention_multiplier"] = head_dim**-0.5
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, use_post_norm=bool(hf.get("use_post_norm", True)))


class HyperCLOVAXAttention(LlamaAttention):
    """LlamaAttention scaled by attention_multiplier."""

    def __init__(self, cfg: HyperCLOVAXConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.scale = cfg.attention_multiplier


class HyperCLOVAXDecoderLayer(LlamaDecoderLayer):
    """The Llama layer whose attention and MLP outputs are each normed (post_norm1 / 2, where
    use_post_norm) and times residual_multiplier before their residual add."""

    attention_cls = HyperCLOVAXAttention

    def __init__(self, cfg: HyperCLOVAXConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
        self.residual_multiplier = cfg.residual_multiplier
        self.post_norm1 = self.post_norm2 = None
        if cfg.use_post_norm:
            self.post_norm1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.post_norm2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def branch_out(self, norm: nn.Module | None, out: torch.Tensor) -> torch.Tensor:
        """A sub-layer's output [T, hidden] as it joins the residual stream."""
        return (out if norm is None else norm(out)) * self.residual_multiplier

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (MLP branch, residual stream without it), as the Llama
        layer's (the next norm adds the two)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.branch_out(self.post_norm1, self.self_attn(hidden, rope))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.branch_out(self.post_norm2, self.mlp(hidden)), residual


class HyperCLOVAXModel(GraniteModel):
    """Granite's model (embeddings times embedding_multiplier) with HyperCLOVA X layers."""

    layer_cls = HyperCLOVAXDecoderLayer


class HyperCLOVAXForCausalLM(GraniteForCausalLM):
    """HyperCLOVA X for causal LM: Granite's contract over HyperCLOVAXModel, logits times
    logits_scaling (Granite divides)."""

    model_cls = HyperCLOVAXModel
    config_cls = HyperCLOVAXConfig

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], times logits_scaling."""
        return self.lm_head(hidden) * self.config.logits_scaling
