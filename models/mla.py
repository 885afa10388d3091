"""Multi-head latent attention (MLA: DeepSeek-V2/V3, GLM-4.7-Flash, MiniCPM3) in its expanded
form: MlaConfig (latent ranks, head dims, the padded cache head dim, the softmax scale),
MlaAttention (per-head K/V made from the latent each step) and MlaModel (its rotary table)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaModel
from compiled_llm.models.rotary import apply_rotary, apply_rotary_interleaved

MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with its default


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's mscale, 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass
class MlaConfig(DecoderConfig):
    """DecoderConfig plus MLA's ranks and head dims. head_dim is the padded dim the attention
    op and the KV cache see (the next power of two over the q/k and v head dims);
    num_key_value_heads is num_attention_heads (MLA expands K/V to every head)."""

    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) ** 2 for a scaled
        rope with mscale_all_dim (transformers' yarn_apply_mscale)."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        scaling, m_all = self.rope_scaling, self.rope_scaling.get("mscale_all_dim")
        if scaling.get("rope_type", "default") != "default" and m_all:
            scale *= yarn_mscale(scaling["factor"], m_all) ** 2
        return scale

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MlaConfig:
        """The Llama keys (rope checked over qk_rope_head_dim, transformers' rope head_dim)
        plus the MLA keys; ValueError naming a field the engine cannot follow."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        dims = {key: get(key) for key in MLA_KEYS}
        base = super().from_hf({**hf_config, "head_dim": dims["qk_rope_head_dim"]}, **defaults)
        heads = base.num_attention_heads
        if base.num_key_value_heads != heads:  # transformers' attention breaks on it too
            raise ValueError(f"num_key_value_heads {base.num_key_value_heads} is not supported "
                             f"for MLA: give num_attention_heads ({heads})")
        qk_dim = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]
        padded = 1 << (max(qk_dim, dims["v_head_dim"]) - 1).bit_length()
        return dataclasses.replace(base, **dims, head_dim=padded, num_key_value_heads=heads,
                                   rope_interleave=bool(get("rope_interleave")))


class MlaAttention(nn.Module):
    """DeepSeek's MLA, expanded: q from q_proj (or q_a_proj -> q_a_layernorm -> q_b_proj),
    kv_a_proj_with_mqa -> a latent (normed, then kv_b_proj to per-head k_nope and v) and one
    shared k_pe head; RoPE on the q_pe / k_pe dims. q, k and v are zero-padded to head_dim for
    the attention op (zeros change no dot product) and the output sliced back. The cache thus
    holds full per-head K and V at the padded dim, far more than the latent (kv_lora_rank +
    qk_rope_head_dim a token): a latent cache with absorbed projections is the later step."""

    def __init__(self, cfg: MlaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads = layer_idx, cfg.num_attention_heads
        self.head_dim, self.scale, self.sliding_window = cfg.head_dim, cfg.softmax_scale, -1
        self.nope_dim, self.rope_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.v_dim, self.kv_lora_rank = cfg.v_head_dim, cfg.kv_lora_rank
        self.q_lora = cfg.q_lora_rank is not None
        q_size = self.num_heads * (self.nope_dim + self.rope_dim)
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        if not self.q_lora:
            self.q_proj = nn.Linear(hidden, q_size, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_size, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank,
                                   self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, hidden, bias=bias)
        # V2 (complex product) and V3 with rope_interleave turn pairs (0, 1), (2, 3), ...; V3
        # lays the result out de-interleaved, the same permutation on q and k: equal scores
        self.rotate = apply_rotary_interleaved if cfg.rope_interleave else apply_rotary

    def query(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> q [T, H, qk_head_dim]."""
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        else:
            q = self.q_proj(hidden)
        return q.view(-1, self.num_heads, self.nope_dim + self.rope_dim)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's padded K/V into the cache."""
        out = self.attend(self.query(hidden), hidden, rope)  # [T, H, v_head_dim]
        return self.o_proj(out.reshape(-1, self.num_heads * self.v_dim))

    def attend(self, q: torch.Tensor, hidden: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """q [T, H, qk_head_dim] and hidden [T, hidden] (K/V's source) -> the attention output
        [T, H, v_head_dim]; writes this layer's padded K/V into the cache."""
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], -1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora_rank, self.rope_dim],
                                                             -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(-1, self.num_heads,
                                                               self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], -1)
        q_pe, k_pe = self.rotate(q_pe, k_pe.unsqueeze(1), rope)  # k_pe: one head [T, 1, R]
        q = torch.cat([q_nope, q_pe], -1)
        k = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1)], -1)
        pad = self.head_dim - q.shape[-1]
        q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))
        v = F.pad(v, (0, self.head_dim - self.v_dim))
        out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window)
        return out[..., : self.v_dim]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by heads (vLLM's split): q_proj / q_b_proj and kv_b_proj keep
        this rank's heads' rows, o_proj their columns (its bias added once, after the
        all-reduce); q_a_proj, kv_a_proj_with_mqa and their norms (the latents every head
        reads) are replicated. The cache holds this rank's heads' K and V."""
        first, count = sharder.query_heads()
        q_name = "q_b_proj" if self.q_lora else "q_proj"
        # a head's q rows (qk_head_dim; more where q_b_proj makes more per head: A.X-K2's gate)
        qk_dim = getattr(self, q_name).out_features // self.num_heads
        kv_dim = self.nope_dim + self.v_dim
        sharder.column(f"{prefix}.{q_name}", getattr(self, q_name), first * qk_dim,
                       count * qk_dim)
        sharder.column(f"{prefix}.kv_b_proj", self.kv_b_proj, first * kv_dim, count * kv_dim)
        sharder.row(f"{prefix}.o_proj", self.o_proj, first * self.v_dim, count * self.v_dim)
        self.num_heads = count


class MlaModel(LlamaModel):
    """The Llama body whose rotary table spans qk_rope_head_dim alone."""

    @staticmethod
    def rotary_config(cfg: MlaConfig) -> MlaConfig:
        """cfg with head_dim qk_rope_head_dim (transformers' head_dim for its rope)."""
        return dataclasses.replace(cfg, head_dim=cfg.qk_rope_head_dim)
