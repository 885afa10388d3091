"""MiMo-V2-Flash (MiMoV2FlashForCausalLM): Llama's pre-norm layers; sliding layers have twice the
KV heads, a sink per query head and their own RoPE base; RoPE turns the leading dims of q/k;
values are narrower (v_head_dim) and scaled, q/k/v zero-padded to one power-of-two cache head
dim; dense MLPs where mlp_layer_types says, else GLM-4.5's float32 grouped sigmoid router over
experts (no shared expert)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.glm4_moe import GroupedTopkMoeBlock, SharedExpertMoeDecoderLayer
from compiled_llm.models.heads_tp import shard_heads
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap
from compiled_llm.models.rotary import RotaryEmbedding, apply_partial_rotary
from compiled_llm.models.tp_helpers import check_heads

SLIDING, FULL = "sliding_attention", "full_attention"
ARCH = "MiMoV2FlashForCausalLM"
# transformers' rope when config.json gives none (the pretrained bases)
DEFAULT_ROPE = {FULL: {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
                SLIDING: {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.334}}


def _kinds(hf: dict[str, Any], key: str, allowed: tuple[str, str], derive) -> list[str]:
    """hf[key] (one of `allowed` per layer), else transformers' default derive(i)."""
    layers = hf["num_hidden_layers"]
    kinds = hf.get(key) or [derive(i) for i in range(layers)]
    if len(kinds) != layers or not set(kinds) <= set(allowed):
        raise ValueError(f"{key} {kinds!r} is not supported for {ARCH}: give {layers} of "
                         f"{list(allowed)}")
    return list(kinds)


def _layer_rope(hf: dict[str, Any], kind: str, qk_dim: int) -> tuple[float, int]:
    """(rope_theta, rotary dims) of a layer type from rope_parameters[kind]; ValueError naming
    the field unless it is the default rope over an even, positive number of dims."""
    params = hf.get("rope_parameters") or DEFAULT_ROPE
    rope = params.get(kind) if isinstance(params, dict) else None
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters.{kind} {rope!r} is not supported for {ARCH}: give "
                         "a default rope (rope_type 'default') per layer type")
    rotary_dim = int(qk_dim * rope.get("partial_rotary_factor", 0.334))
    if rotary_dim % 2 or rotary_dim <= 0:
        raise ValueError(f"rope_parameters.{kind}.partial_rotary_factor turns {rotary_dim} of "
                         f"head_dim {qk_dim} dims; an even, positive number is supported")
    return float(rope["rope_theta"]), rotary_dim


@dataclasses.dataclass
class MiMoV2FlashConfig(DecoderConfig):
    """DecoderConfig plus the q/k and v head dims (head_dim is the padded cache dim), the
    value scale, each layer type's RoPE (theta, rotary dims), and the router's grouping;
    num_key_value_heads is the full layers' (sliding layers': twice it, a TP rank's own)."""

    qk_head_dim: int = 192
    v_head_dim: int = 128
    value_scale: float = 1.0
    ropes: tuple[tuple[float, int], tuple[float, int]] = ((5e6, 64), (1e4, 64))  # full, sliding
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    sliding_kv_heads: int = 0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MiMoV2FlashConfig:
        """transformers' MiMoV2FlashConfig keys; ValueError naming a field it cannot follow."""
        hf = {**defaults, **hf_config}
        if hf.get("sliding_window_size") is not None:  # its reference attends size + 1 tokens
            hf["sliding_window"] = hf["sliding_window_size"] + 1
        kinds = _kinds(hf, "layer_types", (SLIDING, FULL),
                       lambda i: FULL if i == 0 or (i + 1) % 6 == 0 else SLIDING)
        if SLIDING in kinds and not hf.get("sliding_window"):
            raise ValueError(f"sliding_window {hf.get('sliding_window')!r} is not supported "
                             f"for {ARCH} with sliding_attention layers: give a window")
        mlp_kinds = _kinds(hf, "mlp_layer_types", ("dense", "sparse"),
                           lambda i: "dense" if i == 0 else "sparse")
        qk_dim, v_dim = hf["head_dim"], hf["v_head_dim"]
        ropes = tuple(_layer_rope(hf, kind, qk_dim) for kind in (FULL, SLIDING))
        heads = hf["num_attention_heads"]
        kv_heads = hf.get("num_key_value_heads") or heads
        if heads % (2 * kv_heads):
            raise ValueError(f"num_key_value_heads {kv_heads} is not supported for {ARCH}: "
                             f"twice it (the sliding layers') must divide {heads} heads")
        experts = hf["n_routed_experts"]
        groups, topk_group = hf.get("n_group") or 1, hf.get("topk_group") or 1
        if experts % groups or experts // groups < 2 or not 1 <= topk_group <= groups:
            raise ValueError(f"n_group {groups} / topk_group {topk_group} is not supported: "
                             f"{experts} experts must split into n_group groups of 2 or more, "
                             "topk_group of them kept")
        if not 1 <= (hf.get("num_experts_per_tok") or 0) <= topk_group * experts // groups:
            raise ValueError(f"num_experts_per_tok {hf.get('num_experts_per_tok')!r} is not "
                             f"supported for {ARCH}: give 1 to the {topk_group * experts // groups}"
                             " experts of the topk_group groups kept")
        base = super().from_hf({
            **hf, "layer_types": kinds, "num_experts": experts,
            "rope_parameters": {"rope_type": "default", "rope_theta": ropes[0][0]},
            "mlp_only_layers": [i for i, kind in enumerate(mlp_kinds) if kind == "dense"]})
        scale = hf.get("attention_value_scale")
        return dataclasses.replace(
            base, qk_head_dim=qk_dim, v_head_dim=v_dim, head_dim=1 << (max(
                qk_dim, v_dim, 16) - 1).bit_length(), ropes=ropes,
            value_scale=1.0 if scale is None else float(scale), n_group=groups,
            topk_group=topk_group,
            routed_scaling_factor=float(hf.get("routed_scaling_factor") or 1.0))

    def kv_heads(self, layer_idx: int) -> int:
        """The layer's KV heads: twice num_key_value_heads on a sliding layer (a rank's own)."""
        sliding = self.sliding_kv_heads or 2 * self.num_key_value_heads
        return sliding if self.layer_window(layer_idx) > 0 else self.num_key_value_heads

    @property
    def kv_cache_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head dim) of each layer's cache (worker/kv_cache.py reads it)."""
        return tuple((self.kv_heads(i), self.head_dim) for i in range(self.num_hidden_layers))


class MiMoV2FlashAttention(nn.Module):
    """GQA with partial rotate-half RoPE on q/k, values scaled, a sink per query head on the
    sliding layers; q/k/v padded with zeros to the cache head dim, the output cut back to
    v_head_dim before o_proj."""

    def __init__(self, cfg: MiMoV2FlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.sliding_window = layer_idx, cfg.layer_window(layer_idx)
        self.sliding = int(self.sliding_window > 0)  # an index: Dynamo (torch 2.11) takes no bool
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.kv_heads(layer_idx)
        self.qk_dim, self.v_dim, self.head_dim = cfg.qk_head_dim, cfg.v_head_dim, cfg.head_dim
        self.scale, self.value_scale = cfg.qk_head_dim**-0.5, cfg.value_scale
        self.rotary_dim = cfg.ropes[self.sliding][1]
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.qk_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.qk_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.v_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, cfg.hidden_size, bias=False)
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if self.sliding else None

    def forward(self, hidden: torch.Tensor, ropes: tuple[tuple[torch.Tensor, torch.Tensor], ...]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's padded K/V into the cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.qk_dim)  # [T, H, Dqk]
        k = self.k_proj(hidden).view(-1, self.num_kv_heads, self.qk_dim)  # [T, Hkv, Dqk]
        v = self.v_proj(hidden).view(-1, self.num_kv_heads, self.v_dim)  # [T, Hkv, Dv]
        if self.value_scale != 1.0:
            v = v * self.value_scale
        q, k = apply_partial_rotary(q, k, ropes[self.sliding], self.rotary_dim)
        pad = self.head_dim - self.qk_dim
        q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))  # zeros add nothing to q.k
        v = F.pad(v, (0, self.head_dim - self.v_dim))
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window, True,
                             0.0, self.sinks)
        return self.o_proj(attn_out[..., : self.v_dim].flatten(1))  # [T, H*Dv] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """This rank's heads in their own widths; a sliding layer's KV heads to the config."""
        kv_count = shard_heads(sharder, prefix, self, self.qk_dim, self.v_dim)[1]
        if self.sliding:
            config = sharder.model.config
            sharder.model.config = dataclasses.replace(config, sliding_kv_heads=kv_count)


class MiMoV2FlashDecoderLayer(SharedExpertMoeDecoderLayer):
    """The Llama layer over MiMoV2FlashAttention, its MLP dense or GLM-4.5's routed experts."""

    attention_cls = MiMoV2FlashAttention
    moe_cls = GroupedTopkMoeBlock


class LayerTypeRotary(nn.Module):
    """The full layers' and the sliding layers' cos/sin tables, each over its rotary dims."""

    def __init__(self, cfg: MiMoV2FlashConfig, max_len: int) -> None:
        super().__init__()
        self.full, self.sliding = (RotaryEmbedding(dataclasses.replace(
            cfg, head_dim=dim, rope_theta=theta, rope_scaling={"rope_type": "default"}),
            max_len) for theta, dim in cfg.ropes)

    def forward(self, positions: torch.Tensor):
        """((cos, sin) of the full layers, (cos, sin) of the sliding ones), each [T, 1, dim]."""
        return self.full(positions), self.sliding(positions)


class MiMoV2FlashModel(LlamaModel):
    """The Llama body over MiMo-V2-Flash layers, with a rotary table per layer type."""

    layer_cls = MiMoV2FlashDecoderLayer

    def __init__(self, cfg: MiMoV2FlashConfig, max_len: int) -> None:
        nn.Module.__init__(self)  # not Llama's: it would build a head_dim table to drop
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LayerTypeRotary(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]. Llama's loop, its own
        so that pipeline stages are refused: a stage's config would misplace the per-layer KV
        cache shapes."""
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        ropes = self.rotary_emb(positions)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, ropes)
        return self.norm(hidden, residual)[0]


_MTP = re.compile(r"^model\.mtp\.")


class MiMoV2FlashForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """MiMo-V2-Flash for causal LM: the Llama contract over MiMoV2FlashModel; model.mtp.*
    tensors skipped. Tensor parallelism splits each layer's own KV heads; pipeline parallelism
    is refused by name (its body's own loop), LoRA too (a MoE model)."""

    model_cls = MiMoV2FlashModel
    config_cls = MiMoV2FlashConfig
    renamed_modules = {"self_attn.attention_sink_bias": "self_attn.sinks",
                       ".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
                       ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}
    # transformers' MiMoV2FlashConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 192, "v_head_dim": 128, "sliding_window": 129,
                   "num_key_value_heads": 4, "n_routed_experts": 256, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 2048, "n_group": 1, "topk_group": 1,
                   "norm_topk_prob": True, "routed_scaling_factor": 1.0,
                   "attention_value_scale": 0.707, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "attention_bias": False}
    # transformers' MiMoV2Flash reads layer_types and sliding_window, n_routed_experts (its
    # num_local_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob; biases
    # on q/k/v alone, none on the MLPs
    hf_unread = tuple(key for key in WINDOW_KEYS + MOE_KEYS if key not in (
        "layer_types", "sliding_window", "num_experts_per_tok", "moe_intermediate_size",
        "norm_topk_prob")) + ("qkv_bias", "o_proj_bias", "mlp_bias")

    @classmethod
    def weight_name(cls, hf_name: str):
        """MoeWeightMap's target; None for the multi-token-prediction tensors."""
        return None if _MTP.match(hf_name) else super().weight_name(hf_name)

    @staticmethod
    def check_tensor_parallel(config: MiMoV2FlashConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size unless it splits the sliding layers' KV heads."""
        check_heads(world, 2 * config.num_key_value_heads, "the sliding layers' KV heads")
