"""Qwen3-MoE: Qwen3 attention (q/k norms) with sparse MoE blocks, softmax top-k routing.

Layers listed in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
Checkpoints store each expert's gate/up/down_proj; they load stacked into w13/w2.
"""

from __future__ import annotations

from typing import Any

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.moe import MoeWeightMap
from compiled_llm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeDecoderConfig(DecoderConfig):
    """DecoderConfig with HF Qwen3-MoE's window: on every layer, whatever config.json says."""

    @staticmethod
    def sliding_layers(hf_config: dict[str, Any], get) -> tuple[int, ...] | None:
        """None (every layer): HF's Qwen3-MoE reads neither layer_types nor max_window_layers;
        use_sliding_window puts sliding_window on all its layers."""
        return None


class Qwen3MoeForCausalLM(MoeWeightMap, Qwen3ForCausalLM):
    """Qwen3-MoE for causal LM: the Qwen3 model, whose layers route per config.moe."""

    config_cls = Qwen3MoeDecoderConfig
    hf_defaults = {"use_sliding_window": False}
    # no shared expert, window on every layer, biases on all of attention's linears alone
    hf_unread = ("shared_expert_intermediate_size", "max_window_layers", "layer_types",
                 "qkv_bias", "o_proj_bias", "mlp_bias")
