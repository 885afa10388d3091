"""DeepSeek-V3.2 (DeepseekV32ForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3's MLA
layer (models/deepseek.py) under DeepSeek Sparse Attention, whose indexer lets each query attend
its top index_topk keys. Within index_topk tokens the indexer picks every causally visible key,
so attention is plain causal MLA: these models are served there (max_model_len <= index_topk,
config_fields caps it) and the indexer's weights are skipped at load."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.deepseek import DeepseekV3ForCausalLM
from compiled_llm.models.glm4_moe import UNREAD_MOE_KEYS
from compiled_llm.models.glm4_moe_lite import Glm4MoeLiteConfig


@dataclasses.dataclass
class DeepseekV32Config(Glm4MoeLiteConfig):
    """Glm4MoeLiteConfig (dense layers from mlp_layer_types) plus index_topk, the keys each
    query's sparse attention keeps; without mlp_layer_types the first first_k_dense_replace
    layers are dense (transformers' rule for these models)."""

    index_topk: int = 2048

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DeepseekV32Config:
        """Glm4MoeLiteConfig.from_hf, mlp_layer_types derived from first_k_dense_replace where
        absent; ValueError for no q latent (transformers' attention and indexer always read
        q_a_proj's output) or an index_topk that is not a positive whole number."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        arch, topk = hf_config.get("architectures"), get("index_topk")
        if get("q_lora_rank") is None:
            raise ValueError(f"q_lora_rank null is not supported for {arch}: transformers' "
                             "sparse attention always projects q through q_a_proj")
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"index_topk {topk!r} is not supported for {arch}: give the "
                             "positive number of keys each query attends")
        layers = hf_config["num_hidden_layers"]
        if not hf_config.get("mlp_layer_types"):
            dense = min(get("first_k_dense_replace") or 0, layers)
            hf_config = {**hf_config,
                         "mlp_layer_types": ["dense"] * dense + ["sparse"] * (layers - dense)}
        cfg = super().from_hf(hf_config, **defaults)
        return dataclasses.replace(cfg, index_topk=topk)


def within_index_topk(index_topk: int, max_len: int) -> int:
    """max_len, checked against index_topk: ValueError past it (beyond index_topk keys the
    indexer drops visible keys, a sparse attention the engine's attention op does not do)."""
    if max_len > index_topk:
        raise ValueError(f"max_model_len {max_len} exceeds index_topk {index_topk}: DeepSeek "
                         "sparse attention is served within index_topk tokens")
    return max_len


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2 for causal LM: DeepSeek-V3's model (MLA with a q latent, RoPE always on
    interleaved pairs) within index_topk tokens; the indexer's and the multi-token-prediction
    layer's tensors are skipped. Tensor parallelism shards MLA by heads as DeepSeek-V3's;
    LoRA is refused for MoE models."""

    config_cls = DeepseekV32Config
    # transformers' DeepseekV32Config defaults
    hf_defaults = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
                   "attention_bias": False, "n_routed_experts": 256, "n_shared_experts": 1,
                   "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                   "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                   "moe_intermediate_size": 2048, "max_position_embeddings": 163840,
                   "num_key_value_heads": 128, "rope_interleave": True, "index_topk": 2048}
    # DeepSeek-V3's unread keys, and rope_interleave: transformers' attention always turns
    # interleaved pairs (the indexer's own RoPE layout is moot: its weights are skipped)
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias",
                                                 "use_qk_norm", "topk_method", "rope_interleave")

    def __init__(self, cfg: DeepseekV32Config, max_len: int | None = None) -> None:
        max_len = max_len or min(cfg.max_position_embeddings, cfg.index_topk)
        super().__init__(cfg, within_index_topk(cfg.index_topk, max_len))

    def weight_name(self, hf_name: str):
        """DeepseekV3ForCausalLM's target; None for the indexer's tensors (wq_b, wk, k_norm,
        weights_proj): served within index_topk tokens, its top-k holds every causally visible
        key whatever its scores, so they never change the output."""
        if ".self_attn.indexer." in hf_name:
            return None
        return super().weight_name(hf_name)


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    """GLM-5 for causal LM: DeepSeek-V3.2's model under GLM-5's config defaults. Its layers
    that reuse an earlier layer's top-k (indexer_types "shared") pick every visible key too
    within index_topk tokens."""

    hf_defaults = {**DeepseekV32ForCausalLM.hf_defaults, "q_lora_rank": 2048,
                   "qk_nope_head_dim": 192, "v_head_dim": 256, "rms_norm_eps": 1e-5,
                   "n_group": 1, "topk_group": 1, "max_position_embeddings": 202752,
                   "num_key_value_heads": 64}
