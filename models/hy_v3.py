"""Hy3 decoder (HYV3ForCausalLM: tencent/Hy3-preview): Qwen3's attention (per-head q/k norms
before RoPE; attention_bias biases q/k/v/o) in pre-norm Llama layers whose MLPs are GLM-4.5's
shared-expert MoE blocks (models/glm4_moe.py): a float32 sigmoid router, its top-k chosen by
score plus e_score_correction_bias, weights renormalised and times router_scaling_factor,
plus num_shared_experts experts' worth of shared MLP; dense where mlp_layer_types says."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.dots1 import Dots1Model
from compiled_llm.models.glm4_moe import Glm4MoeForCausalLM, SharedExpertMoeConfig
from compiled_llm.models.glm4_moe_lite import dense_layers

# the checkpoint's own names (transformers renames them on load) and transformers 5's, ours
RENAMED = {".mlp.router.gate.": ".mlp.gate.",
           ".mlp.expert_bias": ".mlp.gate.e_score_correction_bias",
           ".mlp.e_score_correction_bias": ".mlp.gate.e_score_correction_bias",
           ".mlp.shared_mlp.": ".mlp.shared_expert.",
           ".mlp.shared_experts.": ".mlp.shared_expert.",
           ".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
           ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}


@dataclasses.dataclass
class HYV3Config(SharedExpertMoeConfig):
    """SharedExpertMoeConfig read from Hy3's keys: num_experts, num_shared_experts,
    router_scaling_factor, mlp_layer_types (transformers' default: the first layer dense)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> HYV3Config:
        """ValueError naming a field the engine cannot follow."""
        if "num_experts" not in hf_config and "num_local_experts" in hf_config:
            hf_config = {**hf_config, "num_experts": hf_config["num_local_experts"]}  # alias

        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        for key in ("num_experts", "num_shared_experts"):
            if not get(key):  # the shared-expert block needs both (Hy3 has both)
                raise ValueError(f"{key} {get(key)!r} is not supported for HYV3ForCausalLM: "
                                 "give a positive number")
        if get("mlp_bias"):  # the shared experts' block is built unbiased
            raise ValueError("mlp_bias True is not supported for HYV3ForCausalLM")
        layers = hf_config["num_hidden_layers"]
        types = hf_config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
        dense = dense_layers(types, layers)
        # the router always renormalises, in one group; the q/k norms are always there
        cfg = super().from_hf({**hf_config, "n_routed_experts": get("num_experts"),
                               "n_shared_experts": get("num_shared_experts"),
                               "routed_scaling_factor": get("router_scaling_factor"),
                               "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                               "use_qk_norm": True}, **defaults)
        return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, mlp_only_layers=dense))


class HYV3ForCausalLM(Glm4MoeForCausalLM):
    """Hy3 for causal LM: GLM-4.5's contract (the multi-token-prediction layer, index
    num_hidden_layers, skipped; tensor parallelism as Qwen2-MoE's; LoRA refused for MoE
    models) over dots.llm1's body (Qwen3 attention, shared-expert MoE layers).
    enable_moe_fp32_combine is read as transformers reads it: adding the routed and shared
    outputs in float32 and rounding once is what the model dtype's add does."""

    model_cls = Dots1Model
    config_cls = HYV3Config
    renamed_modules = RENAMED
    # transformers' HYV3Config defaults
    hf_defaults = {"num_experts": 192, "num_experts_per_tok": 8, "num_shared_experts": 1,
                   "moe_intermediate_size": 1536, "router_scaling_factor": 2.826,
                   "rope_theta": 11_158_840.0, "rms_norm_eps": 1e-5, "head_dim": 128,
                   "max_position_embeddings": 131072, "num_key_value_heads": 8,
                   "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    # no window; attention_bias biases all four projections; Hy3's own MoE keys
    hf_unread = WINDOW_KEYS + (
        "qkv_bias", "o_proj_bias", "norm_topk_prob", "n_routed_experts", "n_shared_experts",
        "n_group", "topk_group", "routed_scaling_factor", "first_k_dense_replace",
        "use_qk_norm", "enable_moe_fp32_combine", "shared_expert_intermediate_size",
        "decoder_sparse_step", "mlp_only_layers")
