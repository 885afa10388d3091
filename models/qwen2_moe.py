"""Qwen2-MoE (Qwen1.5-MoE): biased q/k/v attention with sparse MoE blocks whose output adds a
shared expert scaled by sigmoid(shared_expert_gate(x)); top-k weights are renormalised only
when norm_topk_prob says so (HF's default: not).
"""

from __future__ import annotations

from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap


class Qwen2MoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """Qwen2-MoE for causal LM; q/k/v biases unless config.json sets qkv_bias false."""

    hf_defaults = {"qkv_bias": True, "o_proj_bias": False}
