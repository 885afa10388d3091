"""Meituan LongCat-Flash (LongcatFlashForCausalLM): each decoder layer is two pre-norm
attention + dense MLP sub-blocks (MLA with LoRA-rank scaling, models/mla.py) plus one
shortcut MoE read after the first attention and added after the second MLP; its softmax router
(selection-only correction bias, scaled, never renormalised) also picks zero-computation
experts, which return their input times their weight."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.glm4_moe import Float32Router
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LayersOfSlots, LlamaForCausalLM
from compiled_llm.models.mla import MlaAttention, MlaConfig, MlaModel
from compiled_llm.models.moe import FusedMoE, MoeWeightMap
from compiled_llm.models.moe_routing import grouped_topk

# (key, transformers' attribute_map alias of it); moe_intermediate_size is 5.25's alone
_ALIASES = (("ffn_hidden_size", "intermediate_size"), ("n_routed_experts", "num_local_experts"),
            ("moe_topk", "num_experts_per_tok"), ("expert_ffn_hidden_size", None))
# keys of the released config.json that transformers never reads: only their meaning is followed
_FIXED = {"zero_expert_type": "identity", "attention_method": "MLA", "mla_scale_q_lora": True,
          "mla_scale_kv_lora": True, "router_bias": False}
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")


def _read(hf: dict[str, Any], defaults: dict[str, Any], key: str, alias: str | None) -> Any:
    if alias in hf and key in hf and hf[alias] != hf[key]:
        raise ValueError(f"{alias} {hf[alias]!r} is not supported beside {key} {hf[key]!r}")
    return hf[alias] if alias in hf else hf.get(key, defaults.get(key))


def _refuse(hf: dict[str, Any], get, layers: int, experts: int, top_k: int) -> None:
    """ValueError naming a field that neither transformers (which runs every checkpoint the
    same way) nor the engine can follow."""
    for key, value in _FIXED.items():
        if hf.get(key, value) != value:
            raise ValueError(f"{key} {hf[key]!r} is not supported; have {value!r}")
    if "moe_intermediate_size" in hf:  # transformers 5.17 does not read it
        raise ValueError("moe_intermediate_size is not supported: give expert_ffn_hidden_size")
    if hf.get("num_hidden_layers", 2 * layers) != 2 * layers:
        raise ValueError(f"num_hidden_layers {hf['num_hidden_layers']!r} is not supported: "
                         f"it is 2 * num_layers ({2 * layers})")
    if get("q_lora_rank") is None:  # transformers' attention always takes the q latent
        raise ValueError("q_lora_rank None is not supported for LongcatFlashForCausalLM")
    rope_dim, zero = get("qk_rope_head_dim"), get("zero_expert_num") or 0
    if get("head_dim") != rope_dim:  # transformers' rotary table spans head_dim
        raise ValueError(f"head_dim {get('head_dim')!r} is not supported: give "
                         f"qk_rope_head_dim ({rope_dim})")
    qk_dim = get("qk_nope_head_dim") + rope_dim
    if hf.get("qk_head_dim") not in (None, qk_dim):
        raise ValueError(f"qk_head_dim {hf['qk_head_dim']!r} is not supported: give "
                         f"qk_nope_head_dim + qk_rope_head_dim ({qk_dim})")
    if not experts or not 1 <= top_k <= experts + zero:
        raise ValueError(f"n_routed_experts {experts!r} / moe_topk {top_k!r} is not "
                         f"supported: at least one expert, top-k of them and {zero} zero ones")


@dataclasses.dataclass
class LongcatFlashConfig(MlaConfig):
    """MlaConfig whose num_hidden_layers counts attentions (two per decoder layer, as in
    transformers; the KV cache has one layer per attention), plus the zero experts and the
    router's scale. cfg.moe holds the real experts; is_sparse marks every second attention
    layer, one MoE per decoder layer."""

    zero_expert_num: int = 0
    routed_scaling_factor: float = 1.0

    @property
    def num_layers(self) -> int:
        """Decoder layers (transformers' num_layers)."""
        return self.num_hidden_layers // 2

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> LongcatFlashConfig:
        """MlaConfig.from_hf over LongCat's keys (aliases as transformers' attribute_map);
        ValueError naming a field it cannot follow."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        ffn, experts, top_k, expert_ffn = (_read(hf_config, defaults, *pair)
                                           for pair in _ALIASES)
        layers = get("num_layers")
        _refuse(hf_config, get, layers, experts, top_k)
        hf = {key: value for key, value in hf_config.items() if key not in MOE_KEYS}
        hf.update(num_hidden_layers=2 * layers, intermediate_size=ffn, num_experts=experts,
                  num_experts_per_tok=top_k, moe_intermediate_size=expert_ffn,
                  decoder_sparse_step=2)
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, zero_expert_num=get("zero_expert_num") or 0,
                                   routed_scaling_factor=float(get("routed_scaling_factor")))


class LongcatFlashRouter(nn.Module):
    """classifier (float32 logits [T, E + Z] over the real, then the zero experts) and the
    selection-only e_score_correction_bias, float32 too (`float32_params`) as in transformers."""

    float32_params = ("e_score_correction_bias",)

    def __init__(self, cfg: LongcatFlashConfig) -> None:
        super().__init__()
        experts = cfg.moe.num_experts + cfg.zero_expert_num
        self.classifier = Float32Router(cfg.hidden_size, experts, bias_rows=None)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(experts), requires_grad=False)


class LongcatFlashMoE(nn.Module):
    """Softmax top-k of real and zero experts (chosen by scores + correction bias, weighed by
    the plain scores times routed_scaling_factor). The real picks go through the fused
    experts; a zero expert's pick adds weight * input, computed densely (its slot in the
    expert op gets weight 0 on a real expert, spread over them as transformers does). Under
    tensor parallelism one rank alone adds the zero experts' term to the all-reduced sum."""

    def __init__(self, cfg: LongcatFlashConfig) -> None:
        super().__init__()
        self.top_k, self.scale = cfg.moe.num_experts_per_tok, cfg.routed_scaling_factor
        self.num_experts, self.zero_experts = cfg.moe.num_experts, cfg.zero_expert_num
        self.router = LongcatFlashRouter(cfg)
        self.experts = FusedMoE(cfg.moe.num_experts, cfg.hidden_size,
                                cfg.moe.moe_intermediate_size)
        self.shared_expert, self.adds_zero_experts = None, True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]."""
        weights, ids = grouped_topk(self.router.classifier(hidden), self.top_k, 1, 1, False,
                                    "softmax", self.router.e_score_correction_bias,
                                    self.scale)  # [T, K]
        if not self.zero_experts:
            return self.experts(hidden, weights, ids)
        zero = ids >= self.num_experts
        identity = weights.masked_fill(~zero, 0.0).sum(-1, keepdim=True)  # [T, 1] float32
        spread = (ids - self.num_experts) * self.num_experts // self.zero_experts
        out = self.experts(hidden, weights.masked_fill(zero, 0.0),
                           torch.where(zero, spread, ids))
        return out + (hidden * identity).to(out.dtype) if self.adds_zero_experts else out

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """The sharder's MoE block (expert rows or whole experts, the output all-reduced);
        the zero experts' term on rank 0 alone, so the sum holds it once."""
        sharder.moe(prefix, self)
        self.adds_zero_experts = sharder.tp.rank == 0


class LongcatFlashMLA(MlaAttention):
    """MlaAttention with the latents scaled: q by sqrt(hidden / q_lora_rank) after q_b_proj,
    the normed KV latent by sqrt(hidden / kv_lora_rank) (k_pe unscaled)."""

    def __init__(self, cfg: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_scale = (cfg.hidden_size / cfg.q_lora_rank) ** 0.5
        self.kv_a_layernorm = ScaledRMSNorm(cfg.kv_lora_rank, self.kv_a_layernorm.eps,
                                            (cfg.hidden_size / cfg.kv_lora_rank) ** 0.5)

    def query(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> scaled q [T, H, qk_head_dim]."""
        return super().query(hidden) * self.q_scale


class ScaledRMSNorm(RMSNorm):
    """RMSNorm whose output is multiplied by a constant scale."""

    def __init__(self, dim: int, eps: float, scale: float) -> None:
        super().__init__(dim, eps)
        self.scale = scale

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """scale * norm(hidden)."""
        return super().forward(hidden) * self.scale


class LongcatFlashDecoderLayer(nn.Module):
    """Two attention + MLP sub-blocks (attentions at cache layers 2i and 2i+1) and the
    shortcut MoE, read off the first post-attention norm and added after the second MLP; the
    residual adds ride in the next norm as in the Llama layer."""

    def __init__(self, cfg: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.mlp = LongcatFlashMoE(cfg)
        self.self_attn = nn.ModuleList(LongcatFlashMLA(cfg, 2 * layer_idx + i) for i in (0, 1))
        self.mlps = nn.ModuleList(GatedMLP(cfg.hidden_size, cfg.intermediate_size, False,
                                           cfg.hidden_act) for _ in (0, 1))
        self.input_layernorm = nn.ModuleList(
            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in (0, 1))
        self.post_attention_layernorm = nn.ModuleList(
            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in (0, 1))

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (second MLP output, residual stream without it)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm[0](hidden)
        else:
            hidden, residual = self.input_layernorm[0](hidden, residual)
        hidden = self.self_attn[0](hidden, rope)
        hidden, residual = self.post_attention_layernorm[0](hidden, residual)
        shortcut = self.mlp(hidden)
        hidden, residual = self.input_layernorm[1](self.mlps[0](hidden), residual)
        hidden = self.self_attn[1](hidden, rope)
        hidden, residual = self.post_attention_layernorm[1](hidden, residual)
        # the shortcut joins the residual first, so down_proj's output meets the next norm's
        # add (the small-M GEMM's add + norm epilogue); transformers adds it last
        return self.mlps[1](hidden), residual + shortcut

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Both attentions by heads, both MLPs by intermediate rows, the shortcut MoE."""
        for i in (0, 1):
            self.self_attn[i].shard_for_tp(sharder, f"{prefix}.self_attn.{i}")
            sharder.mlp(f"{prefix}.mlps.{i}", self.mlps[i])
        self.mlp.shard_for_tp(sharder, f"{prefix}.mlp")


class LongcatFlashModel(LayersOfSlots, MlaModel):
    """The Llama body over num_layers LongCat layers (two MLA attentions each)."""

    layer_cls = LongcatFlashDecoderLayer


class LongcatFlashForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """LongCat-Flash for causal LM. The multi-token-prediction tensors (model.mtp) are
    skipped, as are gate/up rows transformers 5.17 stacks for the zero experts (never read).
    Tensor parallelism splits MLA by heads; its two attentions a layer fit no pipeline stage
    (refused by name); LoRA is refused for MoE models."""

    model_cls = LongcatFlashModel
    config_cls = LongcatFlashConfig
    # transformers' LongcatFlashConfig defaults (the keys read through defaults)
    hf_defaults = {"num_layers": 28, "ffn_hidden_size": 12288, "q_lora_rank": 1536,
                   "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "head_dim": 64, "v_head_dim": 128, "moe_topk": 12, "n_routed_experts": 512,
                   "zero_expert_num": 256, "expert_ffn_hidden_size": 2048,
                   "routed_scaling_factor": 6.0, "rms_norm_eps": 1e-5, "rope_theta": 1e7,
                   "max_position_embeddings": 131072, "attention_bias": False,
                   "rope_interleave": True}
    # no window, no MLP biases, RoPE always on interleaved pairs
    hf_unread = WINDOW_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias", "rope_interleave")

    def __init__(self, cfg: LongcatFlashConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.real_experts = (cfg.moe.num_experts, cfg.moe.num_experts + cfg.zero_expert_num)

    def weight_name(self, hf_name: str):
        """MoeWeightMap's target; None for MTP tensors and zero experts' stacked rows."""
        expert, (real, every) = _EXPERT.search(hf_name), self.real_experts
        zero = expert is not None and real <= int(expert[1]) < every
        return None if zero or hf_name.startswith("model.mtp.") else super().weight_name(hf_name)
