"""GLM-4.5 (Glm4MoeForCausalLM) and the DeepSeek-V3-style MoE parts it shares with dots.llm1:
a float32 sigmoid router with a selection-only e_score_correction_bias over grouped experts,
routed weights times routed_scaling_factor, an ungated shared expert, dense MLPs on the first
first_k_dense_replace layers; GLM-4.5's attention turns the leading half of each head
(rotate-half), with optional per-head q/k norms and biased q/k/v."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.glm import GlmConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import grouped_topk
from compiled_llm.models.phi3 import Phi3Model
from compiled_llm.models.qwen3 import Qwen3Attention
from compiled_llm.models.rotary import apply_partial_rotary

# transformers' keys of these routers (DeepseekV3-style), with its defaults where it has them
ROUTER_KEYS = ("n_routed_experts", "n_shared_experts", "first_k_dense_replace", "n_group",
               "topk_group", "routed_scaling_factor")
# MoE keys their transformers classes never read (num_local_experts: n_routed_experts' alias)
UNREAD_MOE_KEYS = tuple(key for key in MOE_KEYS if key not in (
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"))
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclasses.dataclass
class SharedExpertMoeConfig(DecoderConfig):
    """DecoderConfig plus the grouped sigmoid router's settings; cfg.moe holds the experts,
    the shared expert (n_shared_experts * moe_intermediate_size wide) and the dense layers."""

    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    use_qk_norm: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> SharedExpertMoeConfig:
        """The Llama keys, the router's; ValueError naming a field transformers needs or a
        grouping the experts do not split into."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        experts, shared = get("n_routed_experts") or get("num_local_experts"), get(
            "n_shared_experts")
        for key, value in (("n_routed_experts", experts), ("n_shared_experts", shared),
                           ("num_experts_per_tok", get("num_experts_per_tok"))):
            if not value:
                raise ValueError(f"{key} {value!r} is not supported for "
                                 f"{hf_config.get('architectures')}: give a positive number")
        hf = {**hf_config, "num_experts": experts,
              "shared_expert_intermediate_size": get("moe_intermediate_size") * shared,
              "mlp_only_layers": list(range(get("first_k_dense_replace") or 0))}
        base = super().from_hf(hf, **defaults)
        groups, topk_group = get("n_group") or 1, get("topk_group") or 1
        if experts % groups or not 1 <= topk_group <= groups:
            raise ValueError(f"n_group {groups} / topk_group {topk_group} is not supported: "
                             f"{experts} experts must split into n_group groups, "
                             "topk_group of them kept")
        return dataclasses.replace(base, n_group=groups, topk_group=topk_group,
                                   routed_scaling_factor=float(get("routed_scaling_factor")),
                                   use_qk_norm=bool(get("use_qk_norm")))


@dataclasses.dataclass
class Glm4MoeConfig(SharedExpertMoeConfig, GlmConfig):
    """SharedExpertMoeConfig with GLM's partial rotary (partial_rotary_factor, 0.5 unless
    given)."""


class Float32Router(nn.Linear):
    """The router (`gate`): logits [T, E] in float32 from float32 x and weight, as transformers
    computes them; holds the selection-only e_score_correction_bias ([E], ERNIE's [1, E], or
    none where bias_rows is None). Weight and bias stay float32 in any model dtype
    (`float32_params`, honoured by the loader's cast_model), as transformers keeps them."""

    float32_params = ("weight", "e_score_correction_bias")

    def __init__(self, hidden_size: int, num_experts: int,
                 bias_rows: tuple[int, ...] | None = ()) -> None:
        super().__init__(hidden_size, num_experts, bias=False)
        self.e_score_correction_bias = None if bias_rows is None else nn.Parameter(
            torch.zeros(*bias_rows, num_experts), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> float32 router logits [T, E]."""
        return F.linear(hidden.float(), self.weight.float())


class GroupedTopkMoeBlock(SparseMoeBlock):
    """SparseMoeBlock with grouped sigmoid top-k routing (scores + bias select, plain scores
    weigh, renormalised per norm_topk_prob, times routed_scaling_factor) and an ungated shared
    expert (the checkpoint's `shared_experts`)."""

    def __init__(self, cfg: SharedExpertMoeConfig) -> None:
        super().__init__(cfg)
        self.gate = Float32Router(cfg.hidden_size, cfg.moe.num_experts)
        self.shared_expert_gate = None
        self.groups = (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        groups, topk_group, scale = self.groups
        # transformers' DeepSeek-V3, GLM-4.5 and dots.llm1 divide by the sum + 1e-20
        return grouped_topk(router_logits, self.top_k, groups, topk_group, self.renormalize,
                            "sigmoid", self.gate.e_score_correction_bias, scale, 1e-20)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)


class SharedExpertMoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer whose MLP is a moe_cls block where cfg.moe routes the layer, else a
    GatedMLP of intermediate_size (built once: the Llama layer's MLP is not made first)."""

    attention_cls = Qwen3Attention
    moe_cls = GroupedTopkMoeBlock

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = (self.moe_cls(cfg) if cfg.moe.is_sparse(layer_idx) else GatedMLP(
            cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Glm4MoeAttention(Qwen3Attention):
    """LlamaAttention with per-head q/k RMSNorms only where use_qk_norm says, and rotate-half
    RoPE on the leading rotary_dim dims of each head."""

    def __init__(self, cfg: Glm4MoeConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        if not cfg.use_qk_norm:
            self.q_norm = self.k_norm = None
        self.rotary_dim = cfg.rotary_dim

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head of q and k normed over D, when the config has the norms."""
        return (q, k) if self.q_norm is None else super().qk_norm(q, k)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Rotate-half RoPE on the leading rotary_dim dims of each head."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim)


class Glm4MoeDecoderLayer(SharedExpertMoeDecoderLayer):
    """The shared-expert MoE layer with Glm4MoeAttention."""

    attention_cls = Glm4MoeAttention


class Glm4MoeModel(Phi3Model):
    """The Llama body over GLM-4.5 layers, its rotary table over the rotary dims."""

    layer_cls = Glm4MoeDecoderLayer


class Glm4MoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """GLM-4.5 for causal LM. The checkpoint's multi-token-prediction layer (index
    num_hidden_layers) is skipped. Tensor parallelism shards it as Qwen2-MoE's (experts' and
    the shared expert's widths; router replicated); LoRA is refused for MoE models."""

    model_cls = Glm4MoeModel
    config_cls = Glm4MoeConfig
    renamed_modules = {".mlp.shared_experts.": ".mlp.shared_expert."}
    # transformers' Glm4MoeConfig defaults
    hf_defaults = {"n_routed_experts": 128, "n_shared_experts": 1, "first_k_dense_replace": 1,
                   "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                   "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                   "norm_topk_prob": True, "use_qk_norm": False, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "num_key_value_heads": 8,
                   "attention_bias": False, "o_proj_bias": False}
    # no window; biases on q/k/v alone (attention_bias), none on the MLPs
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")

    def __init__(self, cfg: Glm4MoeConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.checkpoint_layers = cfg.num_hidden_layers  # a pipeline stage's config has fewer

    def weight_name(self, hf_name: str):
        """MoeWeightMap's target; None for the multi-token-prediction layer's tensors."""
        layer = _LAYER.match(hf_name)
        if layer is not None and int(layer[1]) >= self.checkpoint_layers:
            return None
        return super().weight_name(hf_name)
