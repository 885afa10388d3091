"""Mixtral: Mistral attention with a sparse MoE block in every layer, softmax top-k routing
always renormalised (whatever config.json says). Checkpoints name the block `block_sparse_moe`
and the experts' gate, down and up projections w1, w2 and w3; the short map below renames them.
"""

from __future__ import annotations

from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap


class MixtralForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """Mixtral for causal LM; its experts' size is config.intermediate_size."""

    hf_defaults = {"norm_topk_prob": True, "rope_theta": 1e6, "rms_norm_eps": 1e-5}  # HF's
    hf_unread = ("use_sliding_window", "max_window_layers", "layer_types", "attention_bias",
                 "qkv_bias", "o_proj_bias", "mlp_bias", "norm_topk_prob", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers")
    renamed_modules = {".block_sparse_moe.": ".mlp."}
    expert_projs = {"w1": ("w13_weight", 0), "w3": ("w13_weight", 1), "w2": ("w2_weight", 0)}
