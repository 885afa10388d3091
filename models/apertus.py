"""Apertus decoder (ApertusForCausalLM: swiss-ai/Apertus-8B and 70B): the Llama layout with
Qwen3's per-head q/k RMSNorms, norms named attention_layernorm / feedforward_layernorm, and an
ungated down_proj(act(up_proj(x))) MLP whose xIELU activation (its default) has learned scalars
per layer (alpha_p, alpha_n, beta, eps: checkpoint tensors under mlp.act_fn)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.arcee import ArceeDecoderLayer
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.llama import LlamaForCausalLM, LlamaModel
from compiled_llm.models.qwen3 import Qwen3Attention

# transformers' names of the layer norms -> the Llama layer's
_NORMS = {".attention_layernorm.": ".input_layernorm.",
          ".feedforward_layernorm.": ".post_attention_layernorm."}


class ApertusConfig(DecoderConfig):
    """DecoderConfig whose hidden_act may be xielu (an activation with parameters, so no
    entry of layers.ACTIVATIONS); transformers' llama3 RoPE where the config names none."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> ApertusConfig:
        """transformers' ApertusConfig keys."""
        hf = dict(hf_config)
        if "rope_parameters" not in hf and "rope_scaling" not in hf:
            hf["rope_parameters"] = dict(defaults["rope_parameters"])
        act = hf.get("hidden_act", defaults.get("hidden_act"))
        if act == "xielu":
            hf["hidden_act"] = "linear"  # checked by DecoderConfig; the MLP builds xIELU
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, hidden_act=act) if act == "xielu" else base


class XIELU(nn.Module):
    """xIELU (arXiv 2411.13010) as transformers' XIELUActivation computes it:
    x > 0: softplus(alpha_p) x^2 + beta x; else (expm1(min(x, eps)) - x) alpha_n' + beta x,
    alpha_n' = beta + softplus(alpha_n). Every scalar is a checkpoint tensor."""

    def __init__(self) -> None:
        super().__init__()
        # transformers' initial values (alpha_p 0.8, alpha_n 0.8 - beta, pre-softplus)
        self.alpha_p = nn.Parameter(torch.tensor([0.8]).expm1().log())
        self.alpha_n = nn.Parameter(torch.tensor([0.3]).expm1().log())
        self.beta = nn.Parameter(torch.tensor(0.5))
        self.eps = nn.Parameter(torch.tensor(-1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., I] -> the same shape and dtype."""
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


class ApertusDecoderLayer(ArceeDecoderLayer):
    """Arcee's layer (the ungated up_proj / down_proj MLP) with Qwen3's attention, its
    activation xIELU where hidden_act says so."""

    attention_cls = Qwen3Attention

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        xielu = cfg.hidden_act == "xielu"
        super().__init__(dataclasses.replace(cfg, hidden_act="linear") if xielu else cfg,
                         layer_idx)
        if xielu:
            self.mlp.act_fn = XIELU()


class ApertusModel(LlamaModel):
    """The Llama body over Apertus layers."""

    layer_cls = ApertusDecoderLayer


class ApertusForCausalLM(LlamaForCausalLM):
    """Apertus for causal LM: the Llama contract over ApertusModel (pipeline parallelism as
    Llama's; tensor parallelism as Llama's, its up_proj split by rows). LoRA is refused
    by the gate_proj it lacks."""

    model_cls = ApertusModel
    config_cls = ApertusConfig
    # transformers' ApertusConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "xielu", "rms_norm_eps": 1e-5, "max_position_embeddings": 65536,
                   "attention_bias": False, "tie_word_embeddings": False,
                   "rope_parameters": {"rope_type": "llama3", "rope_theta": 12000000.0,
                                       "factor": 8.0, "original_max_position_embeddings": 8192,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0}}
    # transformers' Apertus never reads these: no window, no experts, o_proj biased as q/k/v,
    # an unbiased MLP
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name (the layer norms renamed), or None."""
        for theirs, ours in _NORMS.items():
            hf_name = hf_name.replace(theirs, ours)
        return super().weight_name(hf_name)
