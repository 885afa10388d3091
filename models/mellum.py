"""Mellum decoder (MellumForCausalLM: JetBrains/Mellum2-12B-A2.5B): Qwen3-MoE's layer (per-head
q/k RMSNorms before RoPE, softmax top-k experts renormalised per norm_topk_prob) with a sliding
window on the layers layer_types marks sliding, which turn their own default RoPE table
(rope_parameters per layer type), and a dense gated MLP where mlp_layer_types says."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.gemma3 import FULL, SLIDING, split_layer_rope
from compiled_llm.models.moe import MoeWeightMap
from compiled_llm.models.qwen3 import Qwen3ForCausalLM, Qwen3Model
from compiled_llm.models.rotary import local_rotary_embedding

ARCH = "MellumForCausalLM"
# transformers' MellumConfig rope_parameters when config.json has none
DEFAULT_ROPE = {FULL: {"rope_type": "default", "rope_theta": 500000.0},
                SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}


def _kinds(hf: dict[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> list[str]:
    """config.json's per-layer list `key` (default: every layer `default`), checked."""
    layers = hf["num_hidden_layers"]
    kinds = hf.get(key) or [default] * layers
    if len(kinds) != layers or not set(kinds) <= set(allowed):
        raise ValueError(f"{key} {kinds!r} is not supported for {ARCH}: give {layers} of "
                         f"{list(allowed)}")
    return list(kinds)


@dataclasses.dataclass
class MellumConfig(DecoderConfig):
    """DecoderConfig plus the sliding layers' RoPE base (their rope is the default one)."""

    local_rope_theta: float = 10000.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MellumConfig:
        """transformers' MellumConfig keys: layer_types (default: all full), mlp_layer_types
        (default: all sparse), rope_parameters per layer type, each over every dim (a
        partial_rotary_factor makes a table its attention cannot apply: refused by name)."""
        hf = dict(hf_config)
        layer_kinds = _kinds(hf, "layer_types", FULL, (FULL, SLIDING))
        mlp_kinds = _kinds(hf, "mlp_layer_types", "sparse", ("dense", "sparse"))
        params = hf.get("rope_parameters") or DEFAULT_ROPE
        missing = sorted(kind for kind in set(layer_kinds) if not (
            isinstance(params, dict) and isinstance(params.get(kind), dict)))
        if missing:
            raise ValueError(f"rope_parameters needs an entry per layer type for {ARCH}; "
                             f"missing {missing}")
        for kind, entry in params.items():
            if entry and entry.get("partial_rotary_factor", 1.0) != 1.0:
                raise ValueError(f"rope_parameters.{kind}.partial_rotary_factor "
                                 f"{entry['partial_rotary_factor']!r} is not supported for "
                                 f"{ARCH}: its attention turns every dim")
        # transformers' attribute_map: num_experts is num_local_experts (the key it saves)
        experts = hf.get("num_local_experts") or hf.get("num_experts") or defaults["num_experts"]
        hf.update(rope_parameters={FULL: params.get(FULL) or DEFAULT_ROPE[FULL],
                                   SLIDING: params.get(SLIDING) or DEFAULT_ROPE[SLIDING]},
                  layer_types=layer_kinds, decoder_sparse_step=1, num_experts=experts,
                  mlp_only_layers=[i for i, kind in enumerate(mlp_kinds) if kind == "dense"])
        local_theta = split_layer_rope(hf, {"rope_local_base_freq": 10000.0})
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, local_rope_theta=float(local_theta))


class MellumModel(Qwen3Model):
    """The Llama body over Qwen3 layers (dense or sparse per cfg.moe), the sliding layers on
    their own rotary table."""

    def __init__(self, cfg: MellumConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.local_rotary_emb = local_rotary_embedding(cfg, max_len)
        # the table follows layer_types (a sliding layer without a window keeps its own)
        self.sliding = [i in cfg.sliding_window_layers for i in range(cfg.num_hidden_layers)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        ropes = {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}
        for layer, sliding in zip(self.layers, self.sliding, strict=True):
            hidden, residual = layer(hidden, residual, ropes[sliding])  # (cos, sin) [T, 1, D]
        hidden, _ = self.norm(hidden, residual)
        return hidden


class MellumForCausalLM(MoeWeightMap, Qwen3ForCausalLM):
    """Mellum for causal LM: the Llama contract over MellumModel. Tensor parallelism as
    Qwen3-MoE's; pipeline parallelism refused by name (two rotary tables: not LlamaModel's
    layer loop); LoRA is refused for MoE models."""

    model_cls = MellumModel
    config_cls = MellumConfig
    # transformers' MellumConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "sliding_window": 1024, "num_experts": 64,
                   "num_experts_per_tok": 8, "moe_intermediate_size": 896,
                   "norm_topk_prob": True, "rms_norm_eps": 1e-6, "attention_bias": False,
                   "max_position_embeddings": 131072, "tie_word_embeddings": False}
    # Qwen3-MoE's keys Mellum removed (use_sliding_window, decoder_sparse_step,
    # mlp_only_layers), no shared expert, biases on all of attention's linears alone
    hf_unread = ("use_sliding_window", "max_window_layers", "decoder_sparse_step",
                 "mlp_only_layers", "shared_expert_intermediate_size", "qkv_bias",
                 "o_proj_bias", "mlp_bias")
    renamed_modules = {".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
                       ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}

    @classmethod
    def weight_name(cls, hf_name: str):
        """MoeWeightMap's target; None for the multi-token-prediction layer (`mtp.*`, which
        transformers skips too)."""
        return None if hf_name.startswith("mtp.") else super().weight_name(hf_name)
