"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B): ERNIE 4.5's attention (float32
interleaved RoPE, use_bias on every projection) with MoE layers from moe_layer_start_index to
moe_layer_end_index every moe_layer_interval: a float32 softmax router whose top-k is chosen by
probability + e_score_correction_bias (weights renormalised, unbiased), plus an ungated shared
expert; use_bias also biases the dense MLPs, the shared experts and the LM head."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import WINDOW_KEYS, DecoderConfig
from compiled_llm.models.ernie4_5 import Ernie4_5Attention, Ernie4_5Config
from compiled_llm.models.glm4_moe import Float32Router, SharedExpertMoeDecoderLayer
from compiled_llm.models.layers import GatedMLP
from compiled_llm.models.llama import LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import grouped_topk


@dataclasses.dataclass
class Ernie4_5_MoeConfig(Ernie4_5Config):
    """Ernie4_5Config with cfg.moe read from transformers' moe_* keys, and moe_norm_min (the
    floor of the top-k weights' sum when they are renormalised)."""

    moe_norm_min: float = 1e-12

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Ernie4_5_MoeConfig:
        """moe_num_experts (alias num_experts), moe_k (alias num_experts_per_tok), the sparse
        layers' range and interval, moe_num_shared_experts' width; the top-k renormalised."""
        def get(key: str, alias: str | None = None) -> Any:
            value = hf_config.get(key, hf_config.get(alias)) if alias else hf_config.get(key)
            return defaults.get(key) if value is None else value

        _check_moe_ints(hf_config, defaults)
        layers = hf_config["num_hidden_layers"]
        start, end = get("moe_layer_start_index"), get("moe_layer_end_index")
        end = layers - 1 if end == -1 else end
        shared = get("moe_num_shared_experts") or 0
        hf = {**hf_config, "num_experts": get("moe_num_experts", "num_experts"),
              "num_experts_per_tok": get("moe_k", "num_experts_per_tok"),
              "norm_topk_prob": True, "decoder_sparse_step": get("moe_layer_interval"),
              "mlp_only_layers": [i for i in range(layers) if not start <= i <= end],
              "shared_expert_intermediate_size": get("moe_intermediate_size") * shared}
        cfg = super().from_hf(hf, **defaults)
        return dataclasses.replace(cfg, moe_norm_min=float(get("moe_norm_min")))


# the moe_* keys transformers' text model reads as one int each: (the least each may be, the
# alias its config's attribute_map gives it)
_MOE_INTS = {"moe_num_experts": (1, "num_experts"), "moe_k": (1, "num_experts_per_tok"),
             "moe_intermediate_size": (1, None), "moe_num_shared_experts": (0, None),
             "moe_layer_interval": (1, None), "moe_layer_start_index": (None, None),
             "moe_layer_end_index": (None, None)}


def _check_moe_ints(hf_config: dict[str, Any], defaults: dict[str, Any]) -> None:
    """ValueError naming a moe_* key that is not one int within range: ERNIE 4.5 VL's
    per-modality lists, an explicit null (transformers' model fails on it), no experts, or a
    moe_layer_interval of 0 (transformers divides by it)."""
    for key, (least, alias) in _MOE_INTS.items():
        name = alias if key not in hf_config and alias in hf_config else key
        value = hf_config.get(name, defaults.get(key))
        if isinstance(value, bool) or not isinstance(value, int) or (
                least is not None and value < least):
            bound = "" if least is None else f" >= {least}"
            raise ValueError(f"{name} {value!r} is not supported for Ernie4_5_MoeForCausalLM; "
                             f"have one int{bound}")


class Ernie4_5_MoeBlock(SparseMoeBlock):
    """SparseMoeBlock whose float32 router selects the top-k of softmax + correction bias and
    weighs by the renormalised softmax alone; the shared expert is ungated, biased per
    use_bias. The checkpoint's moe_statics.e_score_correction_bias ([1, E]) is the
    router's."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        self.norm_min = cfg.moe_norm_min
        self.gate = Float32Router(cfg.hidden_size, cfg.moe.num_experts, (1,))
        self.shared_expert_gate = None
        size = cfg.moe.shared_expert_intermediate_size
        self.shared_expert = GatedMLP(cfg.hidden_size, size, cfg.mlp_bias) if size else None

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        return grouped_topk(router_logits, self.top_k, 1, 1, self.renormalize, "softmax",
                            self.gate.e_score_correction_bias, renorm_floor=self.norm_min)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)


class Ernie4_5_MoeDecoderLayer(SharedExpertMoeDecoderLayer):
    """The shared-expert MoE layer with ERNIE 4.5's attention and router."""

    attention_cls = Ernie4_5Attention
    moe_cls = Ernie4_5_MoeBlock


class Ernie4_5_MoeModel(LlamaModel):
    """The Llama body over ERNIE 4.5 MoE layers."""

    layer_cls = Ernie4_5_MoeDecoderLayer


class Ernie4_5_MoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """ERNIE 4.5 MoE for causal LM; the checkpoint's multi-token-prediction tensors (`mtp`)
    are skipped. Tensor parallelism shards it as Qwen2-MoE's, but is refused by name with
    use_bias (the LM head's bias is not split by vocabulary); LoRA is refused for MoE."""

    model_cls = Ernie4_5_MoeModel
    config_cls = Ernie4_5_MoeConfig
    # the correction bias: mlp.moe_statics in checkpoints, gate.moe_statics in transformers
    renamed_modules = {".mlp.shared_experts.": ".mlp.shared_expert.",
                       ".mlp.gate.moe_statics.": ".mlp.gate.", ".mlp.moe_statics.": ".mlp.gate."}
    # transformers' Ernie4_5_MoeConfig defaults
    hf_defaults = {"num_key_value_heads": 4, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "use_bias": False,
                   "tie_word_embeddings": True, "moe_intermediate_size": 1536, "moe_k": 6,
                   "moe_num_experts": 64, "moe_num_shared_experts": 2,
                   "moe_layer_start_index": 1, "moe_layer_end_index": -1,
                   "moe_layer_interval": 1, "moe_norm_min": 1e-12}
    # no window; use_bias for every bias; the moe_* keys (num_experts and
    # num_experts_per_tok their aliases) for the experts
    hf_unread = WINDOW_KEYS + ("num_local_experts", "norm_topk_prob",
                               "shared_expert_intermediate_size", "decoder_sparse_step",
                               "mlp_only_layers", "attention_bias", "qkv_bias", "o_proj_bias",
                               "mlp_bias")

    def __init__(self, cfg: DecoderConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        if cfg.mlp_bias:  # use_bias: transformers' LM head is biased too
            self.lm_head.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @classmethod
    def weight_name(cls, hf_name: str):
        """MoeWeightMap's target; None for the multi-token-prediction tensors."""
        return None if "mtp" in hf_name else super().weight_name(hf_name)

    @staticmethod
    def check_tensor_parallel(config: DecoderConfig, world: int) -> None:
        """ValueError naming use_bias: the biased LM head is not split by vocabulary."""
        if config.mlp_bias:
            raise ValueError(f"tensor_parallel_size {world}: Ernie4_5_MoeForCausalLM with "
                             "use_bias (a biased LM head) is not sharded (run it with 1)")
