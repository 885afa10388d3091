"""Qwen2-MoE (Qwen1.5-MoE): biased q/k/v attention with sparse MoE blocks whose output adds a
shared expert scaled by sigmoid(shared_expert_gate(x)); top-k weights are renormalised only
when norm_topk_prob says so (HF's default: not).
"""

from __future__ import annotations

from typing import Any

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap


class Qwen2MoeDecoderConfig(DecoderConfig):
    """DecoderConfig that reads an older Qwen2-MoE config.json (no layer_types) as HF does."""

    @staticmethod
    def sliding_layers(hf_config: dict[str, Any], get) -> tuple[int, ...] | None:
        """layer_types' sliding layers; without it, HF Qwen2MoeConfig's own layer_types: the
        even-indexed layers below max_window_layers (28 when unset)."""
        if hf_config.get("layer_types"):
            return DecoderConfig.sliding_layers(hf_config, get)
        below = min(get("max_window_layers", 28), hf_config["num_hidden_layers"])
        return tuple(range(0, below, 2))

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """DecoderConfig.from_hf; every HF Qwen2-MoE block has a shared expert (a size 0 one
        leaves zero-size tensors in the checkpoint, which are refused)."""
        cfg = super().from_hf(hf_config, **defaults)
        if cfg.moe is not None and not cfg.moe.shared_expert_intermediate_size:
            raise ValueError("shared_expert_intermediate_size 0 is not supported for "
                             "Qwen2MoeForCausalLM (transformers keeps a zero-size shared expert)")
        return cfg


class Qwen2MoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """Qwen2-MoE for causal LM; q/k/v biases unless config.json sets qkv_bias false."""

    config_cls = Qwen2MoeDecoderConfig
    hf_defaults = {"qkv_bias": True, "o_proj_bias": False, "use_sliding_window": False,
                   "shared_expert_intermediate_size": 5632}  # HF's default
    hf_unread = ("attention_bias", "o_proj_bias", "mlp_bias")  # HF: qkv_bias alone
