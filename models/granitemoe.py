"""Granite MoE (GraniteMoeForCausalLM: Granite 3.0 1B-A400M, 3B-A800M): Granite's four scalars
with a sparse MoE block in every layer; its router's softmax over the top-k logits is softmax
over all renormalised over the top k. Checkpoints stack the experts: block_sparse_moe.input_linear
[E, 2I, H] (gate rows, then up rows: w13's layout), output_linear [E, H, I] (w2's), the router
router.layer; transformers 5's names (experts.gate_up_proj, router.weight) load too."""

from __future__ import annotations

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.granite import (
    GraniteAttention,
    GraniteConfig,
    GraniteForCausalLM,
    GraniteModel,
)
from compiled_llm.models.llama import LlamaDecoderLayer
from compiled_llm.models.moe import MoeWeightMap


class GraniteMoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (its MLP the sparse block cfg.moe gives every layer) with
    GraniteAttention, the block's output times residual_multiplier."""

    attention_cls = GraniteAttention

    def __init__(self, cfg: GraniteConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (scaled MoE output, residual stream without it)."""
        hidden, residual = super().forward(hidden, residual, rope)
        return hidden * self.residual_multiplier, residual


class GraniteMoeModel(GraniteModel):
    """The Granite model over GraniteMoe layers."""

    layer_cls = GraniteMoeDecoderLayer


class GraniteMoeForCausalLM(MoeWeightMap, GraniteForCausalLM):
    """GraniteMoe for causal LM: Granite's contract over GraniteMoeModel. Tensor parallelism
    reads each rank's rows of every expert from the stacked checkpoint tensors (expert
    parallelism its whole experts); LoRA is refused for MoE models."""

    model_cls = GraniteMoeModel
    stacked_expert_tensors = True  # [E, 2I, H] and [E, H, I] checkpoint tensors: w13 / w2's
    hf_defaults = {"norm_topk_prob": True}  # softmax over the top-k logits
    # transformers' GraniteMoe reads num_local_experts and intermediate_size (per expert) alone
    # of the MoE keys; no window, no dense MLP, o_proj biased as q/k/v
    hf_unread = WINDOW_KEYS + ("num_experts", "moe_intermediate_size", "norm_topk_prob",
                               "shared_expert_intermediate_size", "decoder_sparse_step",
                               "mlp_only_layers", "qkv_bias", "o_proj_bias", "mlp_bias")
    renamed_modules = {
        ".block_sparse_moe.input_linear.weight": ".mlp.experts.w13_weight",
        ".block_sparse_moe.output_linear.weight": ".mlp.experts.w2_weight",
        ".block_sparse_moe.router.layer.weight": ".mlp.gate.weight",
        ".block_sparse_moe.experts.gate_up_proj": ".mlp.experts.w13_weight",
        ".block_sparse_moe.experts.down_proj": ".mlp.experts.w2_weight",
        ".block_sparse_moe.router.weight": ".mlp.gate.weight",
    }
