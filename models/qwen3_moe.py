"""Qwen3-MoE: Qwen3 attention (q/k norms) with sparse MoE blocks, softmax top-k routing.

Layers listed in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
Checkpoints store each expert's gate/up/down_proj; they load stacked into w13/w2.
"""

from __future__ import annotations

from compiled_llm.models.moe import MoeWeightMap
from compiled_llm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(MoeWeightMap, Qwen3ForCausalLM):
    """Qwen3-MoE for causal LM: the Qwen3 model, whose layers route per config.moe."""
