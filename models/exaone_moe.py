"""K-EXAONE (ExaoneMoeForCausalLM): EXAONE 4.0's attention (per-head q/k norms, sliding layers
with RoPE, full layers without: models/exaone4.py) in pre-norm Llama layers whose MLPs are
GLM-4.5's shared-expert MoE blocks (models/glm4_moe.py: grouped sigmoid routing with a
correction bias), dense where mlp_layer_types (else first_k_dense_replace) says."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.dots1 import Dots1ForCausalLM
from compiled_llm.models.exaone4 import Exaone4Attention, Exaone4Config
from compiled_llm.models.glm4_moe import SharedExpertMoeConfig, SharedExpertMoeDecoderLayer
from compiled_llm.models.glm4_moe_lite import dense_layers
from compiled_llm.models.llama import LlamaModel

# the shared expert's checkpoint name, and the correction bias K-EXAONE keeps beside the
# router (transformers renames it into the gate on load)
RENAMED = {".mlp.shared_experts.": ".mlp.shared_expert.",
           ".mlp.e_score_correction_bias": ".mlp.gate.e_score_correction_bias"}


@dataclasses.dataclass
class ExaoneMoeConfig(SharedExpertMoeConfig, Exaone4Config):
    """SharedExpertMoeConfig (read from num_experts / num_shared_experts) over Exaone4Config's
    layer types and RoPE layers; the dense layers are mlp_layer_types' (transformers'
    default: the first first_k_dense_replace)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> ExaoneMoeConfig:
        """ValueError naming a field the engine cannot follow."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        layers, shared = hf_config["num_hidden_layers"], get("num_shared_experts")
        if not shared:  # the engine's shared-expert block needs one (K-EXAONE has one)
            raise ValueError(f"num_shared_experts {shared!r} is not supported for "
                             "ExaoneMoeForCausalLM: give a positive number")
        first_k = get("first_k_dense_replace") or 0
        types = hf_config.get("mlp_layer_types") or [
            "dense" if i < first_k else "sparse" for i in range(layers)]
        dense = dense_layers(types, layers)
        cfg = super().from_hf({**hf_config, "n_routed_experts": get("num_experts"),
                               "n_shared_experts": shared}, **defaults)
        return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, mlp_only_layers=dense))


class ExaoneMoeDecoderLayer(SharedExpertMoeDecoderLayer):
    """The pre-norm shared-expert MoE layer with EXAONE 4.0's attention."""

    attention_cls = Exaone4Attention


class ExaoneMoeModel(LlamaModel):
    """The Llama body over K-EXAONE layers."""

    layer_cls = ExaoneMoeDecoderLayer


class ExaoneMoeForCausalLM(Dots1ForCausalLM):
    """K-EXAONE for causal LM; the multi-token-prediction tensors (mtp.*) are skipped. Tensor
    parallelism shards it as dots.llm1's (Llama's projection names, experts' and the shared
    expert's widths; per-head q/k norms whole); LoRA is refused for MoE models."""

    model_cls = ExaoneMoeModel
    config_cls = ExaoneMoeConfig
    renamed_modules = RENAMED
    # transformers' ExaoneMoeConfig defaults
    hf_defaults = {"num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
                   "moe_intermediate_size": 1024, "norm_topk_prob": True,
                   "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
                   "first_k_dense_replace": 1, "rms_norm_eps": 1e-5, "sliding_window": 4096,
                   "max_position_embeddings": 2048, "num_key_value_heads": 32}
    # no biases; the window is layer_types' (EXAONE 4.0's rule); experts under their own keys
    hf_unread = ("use_sliding_window", "max_window_layers", "attention_bias", "qkv_bias",
                 "o_proj_bias", "mlp_bias", "use_qk_norm", "num_local_experts",
                 "n_routed_experts", "n_shared_experts", "shared_expert_intermediate_size",
                 "decoder_sparse_step", "mlp_only_layers")

    @classmethod
    def weight_name(cls, hf_name: str):
        """Dots1's target; None for the multi-token-prediction module's tensors."""
        return None if hf_name.startswith("mtp.") else super().weight_name(hf_name)
