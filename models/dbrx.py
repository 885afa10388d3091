"""DBRX (DbrxForCausalLM): pre-norm layers with bias-free LayerNorms, one Wqkv projection clamped
to [-clip_qkv, clip_qkv], and a sparse MoE block in every layer (softmax top-k divided by its
p-norm, moe_normalize_expert_weights). The checkpoint stacks each layer's experts as w1 / v1 /
w2 [E * I, H]: they load into w13 / w2 reshaped (w2 transposed)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.layers import CausalLM, LayerNorm, LMHead, add_and_norm
from compiled_llm.models.llama import LlamaAttention
from compiled_llm.models.moe import FusedMoE
from compiled_llm.models.moe_routing import softmax_topk_pnorm
from compiled_llm.models.rotary import RotaryEmbedding

# DbrxConfig's (and its attn_config / ffn_config's) defaults
DEFAULTS = {"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048}
ATTN_DEFAULTS = {"kv_n_heads": 1, "clip_qkv": None}
FFN_DEFAULTS = {"ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1,
                "moe_normalize_expert_weights": 1.0, "ffn_act_fn": {"name": "silu"}}


@dataclasses.dataclass
class DbrxConfig(DecoderConfig):
    """DecoderConfig plus the q/k/v clamp and the routing weights' p-norm."""

    clip_qkv: float | None = None
    moe_normalize_expert_weights: float | None = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DbrxConfig:
        """DBRX's own keys (d_model, n_heads, attn_config, ffn_config) read as DecoderConfig's.
        RoPE: rope_parameters (or rope_theta) as transformers 5 saves it; a config without
        either (DBRX's own) gives attn_config.rope_theta, the base the model was trained with
        (transformers 5 would use 10000 there)."""
        top = {**DEFAULTS, **hf_config}
        attn = {**ATTN_DEFAULTS, **(hf_config.get("attn_config") or {})}
        ffn = {**FFN_DEFAULTS, **(hf_config.get("ffn_config") or {})}
        act = dict(ffn["ffn_act_fn"] or {"name": "silu"})
        if set(act) - {"name"}:
            raise ValueError(f"ffn_config.ffn_act_fn {act!r} is not supported (a name alone)")
        flat = {key: value for key, value in hf_config.items()
                if key in ("vocab_size", "tie_word_embeddings", "architectures",
                           "rope_parameters", "rope_scaling", "rope_theta")}
        if not any(key in flat for key in ("rope_parameters", "rope_scaling", "rope_theta")):
            flat["rope_theta"] = attn.get("rope_theta", 10000.0)
        flat.update(hidden_size=top["d_model"], num_attention_heads=top["n_heads"],
                    num_hidden_layers=top["n_layers"], max_position_embeddings=top["max_seq_len"],
                    num_key_value_heads=attn["kv_n_heads"],
                    intermediate_size=ffn["ffn_hidden_size"],
                    num_local_experts=ffn["moe_num_experts"],
                    num_experts_per_tok=ffn["moe_top_k"], hidden_act=act.get("name", "silu"))
        base = super().from_hf(flat, **defaults)
        clip, norm = attn["clip_qkv"], ffn["moe_normalize_expert_weights"]
        return dataclasses.replace(base, clip_qkv=None if clip is None else float(clip),
                                   moe_normalize_expert_weights=None if norm is None
                                   else float(norm))


class DbrxAttention(LlamaAttention):
    """GQA attention with RoPE over one Wqkv (q rows, then k, then v; clamped) and out_proj."""

    def __init__(self, cfg: DbrxConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        del self.q_proj, self.k_proj, self.v_proj, self.o_proj
        self.sizes = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.Wqkv = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False)
        self.out_proj = nn.Linear(self.sizes[0], cfg.hidden_size, bias=False)
        self.clip_qkv = cfg.clip_qkv

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D] from Wqkv's one (clamped) output."""
        qkv = self.Wqkv(hidden)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        q, k, v = qkv.split(self.sizes, -1)
        return (q.view(-1, self.num_heads, self.head_dim),
                k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(q, k, rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        return self.out_proj(attn_out.flatten(1))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: Wqkv keeps this rank's q rows, then its KV heads' k and v rows
        (the clamp is elementwise), out_proj their columns."""
        (first, count), heads, dim = sharder.query_heads(), sharder.heads, self.head_dim
        kv_start, kv_size = heads.first_kv_head * dim, heads.num_kv_heads * dim
        sharder.fused_column(f"{prefix}.Wqkv", self.Wqkv, [
            (0, first * dim, count * dim), (self.sizes[0], kv_start, kv_size),
            (self.sizes[0] + self.sizes[1], kv_start, kv_size)])
        sharder.row(f"{prefix}.out_proj", self.out_proj, first * dim, count * dim)
        self.num_heads, self.num_kv_heads = count, heads.num_kv_heads
        self.sizes = [count * dim, kv_size, kv_size]


class DbrxRouter(nn.Module):
    """The router: `layer`, a linear to E logits (jitter is training-only)."""

    def __init__(self, cfg: DbrxConfig) -> None:
        super().__init__()
        self.layer = nn.Linear(cfg.hidden_size, cfg.moe.num_experts, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> router logits [T, E]."""
        return self.layer(hidden)


class DbrxFFN(nn.Module):
    """router -> softmax top-k over its p-norm -> the stacked experts."""

    def __init__(self, cfg: DbrxConfig) -> None:
        super().__init__()
        self.top_k, self.p = cfg.moe.num_experts_per_tok, cfg.moe_normalize_expert_weights
        self.router = DbrxRouter(cfg)
        self.experts = FusedMoE(cfg.moe.num_experts, cfg.hidden_size,
                                cfg.moe.moe_intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]."""
        topk_weights, topk_ids = softmax_topk_pnorm(self.router(hidden), self.top_k, self.p)
        return self.experts(hidden, topk_weights, topk_ids)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: every expert's intermediate rows [start, start + size) of the
        checkpoint's [E * I, H] stacks (w1 / v1 into w13, w2), or whole experts under expert
        parallelism; the router replicated, the block's output all-reduced."""
        experts, at = self.experts, f"{prefix}.experts"
        full, (num, _, hidden) = experts.intermediate_size, experts.w13_weight.shape
        if sharder.expert_parallel:  # whole experts: one run of the stacks' rows
            sharder.whole_experts(at, experts)
            num = experts.num_experts
            size, parts = full, [(sharder.tp.rank * num * full, num * full)]
        else:
            start, size = sharder.split(full, "ffn_config.ffn_hidden_size")
            parts = [(expert * full + start, size) for expert in range(num)]
        sharder.keep_parts(at, experts, "w13_weight", (num, 2 * size, hidden), dim=0,
                           parts=parts)
        sharder.keep_parts(at, experts, "w2_weight", (num, hidden, size), dim=0, parts=parts)
        experts.intermediate_size = size
        sharder.reduce(self)


class DbrxNormAttentionNorm(nn.Module):
    """norm_1 -> attn -> (residual add) norm_2, under the checkpoint's names."""

    def __init__(self, cfg: DbrxConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_1 = LayerNorm(cfg.hidden_size, bias=False)
        self.attn = DbrxAttention(cfg, layer_idx)
        self.norm_2 = LayerNorm(cfg.hidden_size, bias=False)


class DbrxBlock(nn.Module):
    """Pre-norm layer; the residual add rides in the next norm (Llama's layer loop)."""

    def __init__(self, cfg: DbrxConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_attn_norm = DbrxNormAttentionNorm(cfg, layer_idx)
        self.ffn = DbrxFFN(cfg)

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (MoE output, residual stream without it)."""
        block = self.norm_attn_norm
        hidden, residual = add_and_norm(block.norm_1, hidden, residual)
        hidden, residual = block.norm_2(block.attn(hidden, rope), residual)
        return self.ffn(hidden), residual


class DbrxModel(nn.Module):
    """wte, the blocks, norm_f, and the rotary table they share."""

    def __init__(self, cfg: DbrxConfig, max_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(DbrxBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm_f = LayerNorm(cfg.hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden, residual = self.wte(input_ids), None
        rope = self.rotary_emb(positions)
        for block in self.blocks:
            hidden, residual = block(hidden, residual, rope)
        hidden, _ = self.norm_f(hidden, residual)
        return hidden


class StackedExperts(NamedTuple):
    """A checkpoint's [E * I, H] stack of one expert projection: it fills `part` (0: gate
    rows, 1: up rows) of w13, or w2 (transposed) where `part` is None."""

    name: str
    part: int | None
    num_experts: int

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The view of param, [E, I, H], the checkpoint tensor fills."""
        if self.part is None:
            return param.transpose(1, 2)
        return param.chunk(2, dim=1)[self.part]

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """[E * I, H] -> [E, I, H]."""
        return tensor.view(self.num_experts, -1, tensor.shape[-1])


# checkpoint stack -> (our parameter, part)
EXPERT_STACKS = {"w1": ("w13_weight", 0), "v1": ("w13_weight", 1), "w2": ("w2_weight", None)}


class DbrxForCausalLM(CausalLM):
    """DBRX for causal LM: the contract over DbrxModel at `transformer` (tensor parallel by
    its attention's and FFN's shard_for_tp). Pipeline parallelism is refused (its body is not
    LlamaModel's layer loop); LoRA is refused for MoE models."""

    body_name = "transformer"
    embed_name = "transformer.wte"  # split by vocab rows under tensor parallelism
    config_cls = DbrxConfig
    hf_defaults: dict = {}
    hf_unread: tuple[str, ...] = ()

    def __init__(self, cfg: DbrxConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = DbrxModel(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = LMHead(cfg, self.transformer.wte)

    def weight_name(self, hf_name: str) -> str | StackedExperts | None:
        """The identity, but each layer's stacked w1 / v1 / w2 (into w13 / w2)."""
        prefix, _, stack = hf_name.rpartition(".ffn.experts.mlp.")
        if prefix and stack in EXPERT_STACKS:
            param, part = EXPERT_STACKS[stack]
            experts = self.get_submodule(f"{prefix}.ffn.experts")  # (this rank's, under EP)
            return StackedExperts(f"{prefix}.ffn.experts.{param}", part, experts.num_experts)
        return super().weight_name(hf_name)
