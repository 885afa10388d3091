"""HunYuan MoE (HunYuanMoEV1ForCausalLM: Hunyuan-A13B): HunYuan dense's attention (per-head q/k
RMSNorms after RoPE, the NTK alpha rope) with a sparse MoE block in every layer: a float32
router (`gate.wg`), softmax top-k (moe_topk) renormalised, experts and an always-on shared MLP
(`shared_mlp`), all intermediate_size wide. Checkpoint names map onto SparseMoeBlock's."""

from __future__ import annotations

from typing import Any

import torch

from compiled_llm.models.config import WINDOW_KEYS, DecoderConfig
from compiled_llm.models.glm4_moe import Float32Router
from compiled_llm.models.hunyuan import HunYuanAttention, HunYuanConfig
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock


def _per_model(hf: dict[str, Any], key: str, alias: str, default: int) -> int:
    """An int key (or its alias) that transformers also takes as a per-layer list: one value
    for all layers (ValueError naming the key where the layers differ)."""
    value = hf.get(key, hf.get(alias, default))
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"{key} {value!r} is not supported for HunYuanMoEV1ForCausalLM: "
                             "give every layer the same value")
        value = value[0]
    return value


class HunYuanMoeConfig(HunYuanConfig):
    """HunYuanConfig reading num_experts and moe_topk (an int, or a per-layer list of one
    value); experts and the shared MLP are intermediate_size wide, top-k renormalised."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """HunYuanConfig.from_hf over transformers' HunYuanMoEV1Config keys."""
        hf = {**defaults, **hf_config}
        hf.update(num_experts=_per_model(hf, "num_experts", "num_local_experts", 1),
                  num_experts_per_tok=_per_model(hf, "moe_topk", "num_experts_per_tok", 1),
                  moe_intermediate_size=hf["intermediate_size"],
                  shared_expert_intermediate_size=hf["intermediate_size"], norm_topk_prob=True)
        return super().from_hf(hf, **defaults)


class HunYuanMoeBlock(SparseMoeBlock):
    """SparseMoeBlock with a float32 router and the shared expert added ungated."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        # transformers keeps `wg` float32 whatever the model's dtype: so does the loader
        self.gate = Float32Router(cfg.hidden_size, cfg.moe.num_experts, bias_rows=None)
        self.shared_expert_gate = None

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H]: transformers' shared_mlp has no gate."""
        return self.shared_expert(hidden)


class HunYuanMoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with HunYuanAttention and the HunYuan MoE block."""

    attention_cls = HunYuanAttention

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = HunYuanMoeBlock(cfg)


class HunYuanMoeModel(LlamaModel):
    """The Llama body over HunYuan MoE layers."""

    layer_cls = HunYuanMoeDecoderLayer


class HunYuanMoEV1ForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """HunYuan MoE for causal LM: the Llama contract over HunYuanMoeModel. Tensor parallelism
    as Qwen2-MoE's (the shared MLP sharded as its shared expert; the per-head q/k norms stay
    whole), pipeline parallelism as Llama's; LoRA is refused for MoE models."""

    model_cls = HunYuanMoeModel
    config_cls = HunYuanMoeConfig
    hf_defaults = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048}
    # transformers' HunYuan MoE reads num_experts and moe_topk (num_local_experts and
    # num_experts_per_tok their aliases) alone of the MoE keys (its checkpoints'
    # moe_intermediate_size, num_shared_expert, use_mixed_mlp_moe and the like are unread:
    # every size is intermediate_size); no window; o_proj biased as q/k/v
    hf_unread = WINDOW_KEYS + ("moe_intermediate_size", "norm_topk_prob",
                               "shared_expert_intermediate_size", "decoder_sparse_step",
                               "mlp_only_layers", "qkv_bias", "o_proj_bias", "mlp_bias")
    renamed_modules = {".mlp.shared_mlp.": ".mlp.shared_expert.", ".mlp.gate.wg.": ".mlp.gate."}
