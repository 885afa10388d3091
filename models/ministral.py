"""Ministral decoder (MinistralForCausalLM: Ministral-8B-Instruct-2410): Mistral's unbiased Llama
layout whose sliding window applies only to the layers layer_types marks sliding_attention
(every layer where layer_types is absent and sliding_window is set, as transformers derives)."""

from __future__ import annotations

from compiled_llm.models.config import MOE_KEYS
from compiled_llm.models.llama import LlamaForCausalLM


class MinistralForCausalLM(LlamaForCausalLM):
    """Ministral for causal LM: the Llama contract (tensor and pipeline parallelism and LoRA as
    Llama's); DecoderConfig reads layer_types for the windowed layers."""

    # transformers' MinistralConfig defaults (config.json may leave any of them out)
    hf_defaults = {"sliding_window": 4096, "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 131072, "tie_word_embeddings": False}
    # transformers' Ministral never reads these: q/k/v/o and the MLP unbiased, no experts, its
    # window where layer_types (or sliding_window alone) says
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "attention_bias",
                            "qkv_bias", "o_proj_bias", "mlp_bias")
