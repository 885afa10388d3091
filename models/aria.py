"""Aria's text model (AriaTextForCausalLM): Llama attention over experts on every layer,
routed by softmax over the top-k logits (softmax top-k renormalised), SiLU-gated whatever
hidden_act says, plus moe_num_shared_experts experts as one ungated MLP (hidden_act, mlp_bias)
of intermediate_size * moe_num_shared_experts. The checkpoint's grouped-GEMM expert stacks
(fc1 / fc2, or gate_up_proj / down_proj: [E, in, out]) load transposed into the fused layout."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig, MoeConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.llama4 import Llama4TextMoe, TransposedExperts
from compiled_llm.models.moe import SparseMoeBlock

# the checkpoint's stacked expert tensors (as transformers 5.17 and 5.25 save them: fc1 / fc2;
# 5.25's module names: gate_up_proj / down_proj) -> our stacked parameter
EXPERT_STACKS = {"fc1.weight": "w13_weight", "fc2.weight": "w2_weight",
                 "gate_up_proj": "w13_weight", "down_proj": "w2_weight"}


class AriaTextConfig(DecoderConfig):
    """DecoderConfig whose experts come from moe_num_experts / moe_topk / moe_num_shared_experts
    (transformers' AriaTextConfig spellings), every layer sparse."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """DecoderConfig.from_hf with the MoE fields read from Aria's keys; ValueError for no
        shared expert (transformers then keeps a zero-width shared MLP) and for a quantized
        checkpoint (its expert stacks have no format of ours)."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        if hf_config.get("quantization_config"):
            raise ValueError("quantization_config: quantized Aria checkpoints are not "
                             "supported yet")
        shared = get("moe_num_shared_experts")
        if not shared:
            raise ValueError(f"moe_num_shared_experts {shared!r} is not supported for "
                             "AriaTextForCausalLM (transformers keeps a zero-width shared MLP)")
        cfg = super().from_hf(hf_config, **defaults)
        inter = hf_config["intermediate_size"]  # each routed expert's width
        moe = MoeConfig(num_experts=get("moe_num_experts"), num_experts_per_tok=get("moe_topk"),
                        moe_intermediate_size=inter, norm_topk_prob=True,
                        shared_expert_intermediate_size=inter * shared)
        return dataclasses.replace(cfg, moe=moe)


class AriaTextMoELayer(SparseMoeBlock):
    """SparseMoeBlock (softmax top-k, renormalised) plus the shared experts as one ungated
    GatedMLP (mlp_bias, hidden_act); HF's router and shared_experts load as gate and
    shared_expert."""

    def __init__(self, cfg: DecoderConfig) -> None:
        routed = dataclasses.replace(cfg.moe, shared_expert_intermediate_size=0)
        super().__init__(dataclasses.replace(cfg, moe=routed))
        self.shared_expert = GatedMLP(cfg.hidden_size, cfg.moe.shared_expert_intermediate_size,
                                      cfg.mlp_bias, cfg.hidden_act)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Llama 4's split (its expert stacks are laid out as these): intermediate rows of
        every expert and of the shared MLP, the block's sum all-reduced, so the shared MLP's
        down_proj bias is held by one rank."""
        Llama4TextMoe.shard_for_tp(self, sharder, prefix)
        if self.shared_expert.down_proj.bias is not None:
            sharder.add_once(f"{prefix}.shared_expert.down_proj", "bias")


class AriaTextDecoderLayer(LlamaDecoderLayer):
    """The Llama layer over an AriaTextMoELayer (built once: not the Llama layer's MLP first)."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = AriaTextMoELayer(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class AriaTextModel(LlamaModel):
    """The Llama model over Aria's layers."""

    layer_cls = AriaTextDecoderLayer


class AriaTextForCausalLM(LlamaForCausalLM):
    """Aria's text model for causal LM; tensor and expert parallelism through its MoE blocks'
    shard_for_tp. LoRA is refused by name (MoE)."""

    model_cls = AriaTextModel
    config_cls = AriaTextConfig
    # transformers' AriaTextConfig defaults (config.json may leave them out)
    hf_defaults = {"moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2}
    # keys transformers' Aria never reads: no window, Qwen/Mixtral expert spellings, o_proj
    # biased as q/k/v (attention_bias)
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
    # transformers' stacked experts are [E, in, out] whatever the shapes (a text stack takes
    # them from here, not by shape)
    stacked_experts_transposed = True

    @classmethod
    def weight_name(cls, hf_name: str):
        """Our parameter for a checkpoint tensor: router -> gate, shared_experts ->
        shared_expert, the expert stacks transposed into w13 / w2."""
        prefix, _, stack = hf_name.rpartition(".mlp.experts.")
        if prefix and stack in EXPERT_STACKS:
            return TransposedExperts(f"{prefix}.mlp.experts.{EXPERT_STACKS[stack]}")
        hf_name = hf_name.replace(".mlp.router.", ".mlp.gate.")
        return super().weight_name(hf_name.replace(".mlp.shared_experts.",
                                                   ".mlp.shared_expert."))
