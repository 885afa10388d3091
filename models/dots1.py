"""dots.llm1 (Dots1ForCausalLM): Qwen3's attention (per-head q/k RMSNorms, biases on all four
projections where attention_bias says) with GLM-4.5's MoE layers (models/glm4_moe.py: grouped
sigmoid routing with a correction bias, an ungated shared expert, dense first layers); sliding
windows on the layers layer_types marks (else from max_window_layers on)."""

from __future__ import annotations

from compiled_llm.models.glm4_moe import (
    UNREAD_MOE_KEYS,
    SharedExpertMoeConfig,
    SharedExpertMoeDecoderLayer,
)
from compiled_llm.models.llama import LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap


class Dots1Model(LlamaModel):
    """The Llama body over shared-expert MoE layers with Qwen3's attention."""

    layer_cls = SharedExpertMoeDecoderLayer


class Dots1ForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """dots.llm1 for causal LM. Tensor parallelism shards it as Qwen2-MoE's (experts' and the
    shared expert's widths; router replicated); LoRA is refused for MoE models."""

    model_cls = Dots1Model
    config_cls = SharedExpertMoeConfig
    renamed_modules = {".mlp.shared_experts.": ".mlp.shared_expert."}
    # transformers' Dots1Config defaults (it has none for the expert counts: required)
    hf_defaults = {"first_k_dense_replace": 0, "n_group": 1, "topk_group": 1,
                   "routed_scaling_factor": 1.0, "norm_topk_prob": False, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 2048, "attention_bias": False,
                   "sliding_window": 4096, "max_window_layers": 62}
    # attention_bias biases o_proj too; the window is layer_types' (or max_window_layers')
    hf_unread = UNREAD_MOE_KEYS + ("use_sliding_window", "use_qk_norm", "qkv_bias",
                                   "o_proj_bias", "mlp_bias")
