"""CWM decoder (CwmForCausalLM: facebook/cwm, Code World Model): the unbiased Llama layout whose
sliding window applies to the layers layer_types marks sliding_attention (where config.json has
no layer_types, every layer but each fourth, from the first, as transformers derives); llama3
RoPE by default."""

from __future__ import annotations

from typing import Any

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.llama import LlamaForCausalLM


class CwmConfig(DecoderConfig):
    """DecoderConfig with transformers' CwmConfig derivations: layer_types (layers 0, 4, 8, ...
    full, the rest sliding) and the llama3 RoPE where the config names none."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> CwmConfig:
        """transformers' CwmConfig keys."""
        hf = dict(hf_config)
        if "rope_parameters" not in hf and "rope_scaling" not in hf:
            hf["rope_parameters"] = dict(defaults["rope_parameters"])
        if not hf.get("layer_types"):
            hf["layer_types"] = ["full_attention" if i % 4 == 0 else "sliding_attention"
                                 for i in range(hf["num_hidden_layers"])]
        return super().from_hf(hf, **defaults)


class CwmForCausalLM(LlamaForCausalLM):
    """CWM for causal LM: the Llama contract (tensor and pipeline parallelism and LoRA as
    Llama's); the window on the sliding layers alone."""

    config_cls = CwmConfig
    # transformers' CwmConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "sliding_window": 8192,
                   "mlp_bias": False, "tie_word_embeddings": False, "rope_theta": 1e6,
                   "rope_parameters": {
                       "rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}
    # transformers' CWM never reads these: q/k/v/o unbiased, no experts, its window where
    # layer_types says
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "attention_bias",
                            "qkv_bias", "o_proj_bias")
