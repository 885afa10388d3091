"""Mixtral: Mistral attention with a sparse MoE block in every layer, softmax top-k routing
always renormalised. Checkpoints name the block `block_sparse_moe` and the experts' gate, down
and up projections w1, w2 and w3; the short map below renames them.
"""

from __future__ import annotations

from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap, moe_or_dense_mlp


class MixtralDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with a SparseMoeBlock as its MLP."""

    make_mlp = staticmethod(moe_or_dense_mlp)


class MixtralModel(LlamaModel):
    """The Llama model with Mixtral layers."""

    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """Mixtral for causal LM; its experts' size is config.intermediate_size."""

    model_cls = MixtralModel
    hf_defaults = {"norm_topk_prob": True}
    renamed_modules = {".block_sparse_moe.": ".mlp."}
    expert_projs = {"w1": ("w13_weight", 0), "w3": ("w13_weight", 1), "w2": ("w2_weight", 0)}
