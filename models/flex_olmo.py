"""FlexOlmo (FlexOlmoForCausalLM: FlexOlmo-7x7B): OLMo 2's post-norm layer (q/k normed over the
whole projection, norms that scale in float32) with a sparse MoE block as every layer's MLP
(router `gate`, softmax top-k renormalised per norm_topk_prob; each expert's gate/up/down_proj,
as transformers saves them, stacked into w13 / w2)."""

from __future__ import annotations

from typing import Any

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.olmo2 import Olmo2DecoderLayer, Olmo2ForCausalLM, Olmo2Model


class FlexOlmoConfig(DecoderConfig):
    """DecoderConfig reading num_local_experts as transformers' alias of num_experts."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """DecoderConfig.from_hf with num_experts from num_local_experts, else HF's 7."""
        hf = dict(hf_config)
        hf.setdefault("num_experts", hf.get("num_local_experts") or 7)
        return super().from_hf(hf, **defaults)


class FlexOlmoDecoderLayer(Olmo2DecoderLayer):
    """OLMo 2's layer with the sparse MoE block as its MLP."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = SparseMoeBlock(cfg)


class FlexOlmoModel(Olmo2Model):
    """OLMo 2's body over FlexOlmo layers."""

    layer_cls = FlexOlmoDecoderLayer


class FlexOlmoForCausalLM(MoeWeightMap, Olmo2ForCausalLM):
    """FlexOlmo for causal LM: the Llama contract over FlexOlmoModel. Tensor parallelism shards
    as OLMo 2's attention and Qwen-MoE's experts; pipeline parallelism is refused by name (its
    body is not LlamaModel's layer loop); LoRA is refused for MoE models."""

    model_cls = FlexOlmoModel
    config_cls = FlexOlmoConfig
    # transformers' FlexOlmoConfig defaults
    hf_defaults = {"rms_norm_eps": 1e-6, "rope_theta": 500000.0, "max_position_embeddings": 4096,
                   "num_experts_per_tok": 5, "norm_topk_prob": False}
    # it reads num_experts (num_local_experts its alias), num_experts_per_tok, norm_topk_prob
    # and intermediate_size (per expert) of the MoE keys; o_proj is biased as q/k/v
    hf_unread = WINDOW_KEYS + tuple(key for key in MOE_KEYS if key not in (
        "num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob")) + (
        "qkv_bias", "o_proj_bias", "mlp_bias")
