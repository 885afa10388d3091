"""GPT-OSS (GptOssForCausalLM: gpt-oss-20b, -120b): the Llama layer with biased attention, a
learned sink logit per query head in every softmax, sliding and full layers (layer_types), YaRN
RoPE, and a sparse MoE block in every layer (a biased router, softmax over its top-k logits;
experts with biases and the clamped SwiGLU, the fused MoE op's swigluoai). Checkpoints stack the
experts transposed, gate and up columns interleaved: they load into w13/w2 reordered."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.moe import FusedMoE
from compiled_llm.models.moe_routing import softmax_topk

# transformers' GptOssConfig rope when config.json gives none
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


@dataclasses.dataclass
class GptOssConfig(DecoderConfig):
    """DecoderConfig plus the experts' clamped SwiGLU constants."""

    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GptOssConfig:
        """transformers' GptOssConfig keys: num_local_experts, intermediate_size (per expert),
        swiglu_limit, layer_types (default: even layers slide), YaRN unless rope is given."""
        hf = dict(hf_config)
        if "rope_parameters" not in hf and "rope_scaling" not in hf:
            hf["rope_parameters"] = dict(DEFAULT_ROPE)
        if not hf.get("layer_types"):
            hf["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                 for i in range(hf["num_hidden_layers"])]
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
                                   swiglu_limit=float(hf.get("swiglu_limit", 7.0)))


class GptOssAttention(LlamaAttention):
    """Llama attention (biased q/k/v/o) with `sinks` [H]: each head's logit joins its softmax
    as a key of value 0."""

    def __init__(self, cfg: GptOssConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.sinks = nn.Parameter(torch.empty(self.num_heads))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(q, k, rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window, True,
                             0.0, self.sinks)
        return self.o_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]


class GptOssMoE(nn.Module):
    """router (biased) -> softmax over the top-k logits -> experts with biases and swigluoai."""

    def __init__(self, cfg: GptOssConfig) -> None:
        super().__init__()
        self.top_k = cfg.moe.num_experts_per_tok
        self.router = nn.Linear(cfg.hidden_size, cfg.moe.num_experts, bias=True)
        self.experts = FusedMoE(cfg.moe.num_experts, cfg.hidden_size,
                                cfg.moe.moe_intermediate_size, bias=True,
                                activation="swigluoai", swiglu_alpha=cfg.swiglu_alpha,
                                swiglu_limit=cfg.swiglu_limit)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]."""
        # softmax over the top-k logits = softmax over all, renormalised over the top k
        topk_weights, topk_ids = softmax_topk(self.router(hidden), self.top_k, True)
        return self.experts(hidden, topk_weights, topk_ids)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: the router replicated, the block's output all-reduced; each
        expert's intermediate rows [start, start + size) (w13's gate and up rows and bias, the
        checkpoint's interleaved columns [2 * start, 2 * (start + size)); w2's columns) with
        w2's bias added once; or, under expert parallelism, whole experts and their biases."""
        experts, at = self.experts, f"{prefix}.experts"
        sharder.reduce(self)
        if sharder.expert_parallel:  # the stacked checkpoint tensors' expert rows
            sharder.whole_experts(at, experts)
            return
        start, size = sharder.split(experts.intermediate_size, "intermediate_size")
        num, hidden = experts.num_experts, experts.w13_weight.shape[2]
        # checkpoint gate_up_proj [E, H, 2I], gate_up_proj_bias [E, 2I], down_proj [E, I, H]
        sharder.keep(at, experts, "w13_weight", (num, 2 * size, hidden), dim=2,
                     start=2 * start, size=2 * size)
        sharder.keep(at, experts, "w13_bias", (num, 2 * size), dim=1, start=2 * start,
                     size=2 * size)
        sharder.keep(at, experts, "w2_weight", (num, hidden, size), dim=1, start=start,
                     size=size)
        sharder.add_once(at, "w2_bias")
        experts.intermediate_size = size


class GptOssDecoderLayer(LlamaDecoderLayer):
    """The Llama layer over GptOssAttention and GptOssMoE."""

    attention_cls = GptOssAttention

    def __init__(self, cfg: GptOssConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)  # not the Llama layer's: it would build a MoE block to drop
        self.self_attn = GptOssAttention(cfg, layer_idx)
        self.mlp = GptOssMoE(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GptOssModel(LlamaModel):
    """The Llama body over GPT-OSS layers."""

    layer_cls = GptOssDecoderLayer


def _uninterleave(tensor: torch.Tensor) -> torch.Tensor:
    """[..., 2I] with gate at even and up at odd positions -> [..., 2I] gate first, then up."""
    return torch.cat([tensor[..., 0::2], tensor[..., 1::2]], -1)


class ExpertTensor(NamedTuple):
    """A stacked expert tensor of the checkpoint: it fills `name` (transposed where
    `transposed`), its last dim's interleaved gate/up columns reordered where `interleaved`."""

    name: str
    transposed: bool
    interleaved: bool

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The view of param the checkpoint tensor fills."""
        return param.transpose(1, 2) if self.transposed else param

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """The checkpoint tensor in param's order."""
        return _uninterleave(tensor) if self.interleaved else tensor


# checkpoint suffix -> (our parameter, transposed, interleaved gate/up)
EXPERT_TENSORS = {"gate_up_proj": ("w13_weight", True, True),
                  "gate_up_proj_bias": ("w13_bias", False, True),
                  "down_proj": ("w2_weight", True, False),
                  "down_proj_bias": ("w2_bias", False, False)}


class GptOssForCausalLM(LlamaForCausalLM):
    """GPT-OSS for causal LM: the Llama contract over GptOssModel (pipeline parallelism as
    Llama's; tensor and expert parallelism through its modules' shard_for_tp). LoRA is refused
    for MoE models."""

    model_cls = GptOssModel
    config_cls = GptOssConfig
    # transformers' GptOssConfig defaults (config.json may leave any of them out)
    hf_defaults = {"rope_theta": 150000.0, "sliding_window": 128, "attention_bias": True,
                   "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
                   "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                   "norm_topk_prob": True}
    # transformers' GptOss reads num_local_experts (num_experts is its alias) and
    # num_experts_per_tok alone of the MoE keys; o_proj is biased as q/k/v
    hf_unread = tuple(key for key in MOE_KEYS if key not in (
        "num_experts", "num_local_experts", "num_experts_per_tok")) + (
        "use_sliding_window", "max_window_layers", "qkv_bias", "o_proj_bias", "mlp_bias")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | ExpertTensor | None:
        """The identity, but the stacked expert tensors, which fill w13/w2 reordered."""
        prefix, _, suffix = hf_name.rpartition(".mlp.experts.")
        if prefix and suffix in EXPERT_TENSORS:
            param, transposed, interleaved = EXPERT_TENSORS[suffix]
            return ExpertTensor(f"{prefix}.mlp.experts.{param}", transposed, interleaved)
        return super().weight_name(hf_name)
