"""Seed-OSS decoder (SeedOssForCausalLM: ByteDance-Seed/Seed-OSS-36B): the Llama layout with
q/k/v biased where attention_bias says (on by default) and o_proj where attention_out_bias does
(off by default), head_dim 128 unless config.json says; its dropouts are training-only."""

from __future__ import annotations

from typing import Any

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.llama import LlamaForCausalLM


class SeedOssConfig(DecoderConfig):
    """DecoderConfig whose o_proj bias is Seed-OSS's attention_out_bias."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> SeedOssConfig:
        """transformers' SeedOssConfig keys: attention_bias (q/k/v), attention_out_bias (o)."""
        hf = dict(hf_config)
        hf["o_proj_bias"] = bool(hf.get("attention_out_bias",
                                        defaults.get("attention_out_bias", False)))
        return super().from_hf(hf, **defaults)


class SeedOssForCausalLM(LlamaForCausalLM):
    """Seed-OSS for causal LM: the Llama contract over the Llama body (tensor and pipeline
    parallelism and LoRA as Llama's: its biases are on the projections Llama shards)."""

    config_cls = SeedOssConfig
    # transformers' SeedOssConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 8, "attention_bias": True,
                   "attention_out_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 524288, "tie_word_embeddings": False}
    # transformers' Seed-OSS never reads these: no window, no experts, o_proj's bias is
    # attention_out_bias
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
