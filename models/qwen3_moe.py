"""Qwen3-MoE: Qwen3 attention (q/k norms) with sparse MoE blocks, softmax top-k routing.

Layers listed in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
Checkpoints store each expert's gate/up/down_proj; they load stacked into w13/w2.
"""

from __future__ import annotations

from compiled_llm.models.llama import LlamaModel
from compiled_llm.models.moe import MoeWeightMap, moe_or_dense_mlp
from compiled_llm.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    """The Qwen3 layer whose MLP is a SparseMoeBlock where the config routes the layer."""

    make_mlp = staticmethod(moe_or_dense_mlp)


class Qwen3MoeModel(LlamaModel):
    """The Llama model with Qwen3-MoE layers."""

    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MoeWeightMap, Qwen3ForCausalLM):
    """Qwen3-MoE for causal LM: the Llama contract over Qwen3MoeModel."""

    model_cls = Qwen3MoeModel
