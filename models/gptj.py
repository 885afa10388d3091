"""GPT-J decoder (GPTJForCausalLM: GPT-J 6B): one LayerNorm per block (ln_1) feeding attention
and the MLP in parallel (x + attn(ln_1(x)) + mlp(ln_1(x))), bias-free q/k/v_proj and out_proj,
RoPE on interleaved pairs of the leading rotary_dim dims of each head, fc_in -> gelu_new ->
fc_out, the final ln_f and a biased lm_head. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.fused_heads import shard_split_attention
from compiled_llm.models.gpt2 import IGNORED_WEIGHTS, GPT2Config
from compiled_llm.models.layers import CausalLM, DenseMLP
from compiled_llm.models.rotary import (
    RotaryEmbedding,
    apply_partial_rotary,
    apply_rotary_interleaved,
)


@dataclasses.dataclass
class GPTJConfig(GPT2Config):
    """GPT-2's spelling (n_embd, n_layer, n_head, n_positions, n_inner, activation_function,
    layer_norm_epsilon) plus rotary_dim, the leading dims of a head that RoPE turns."""

    rotary_dim: int = 64

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GPTJConfig:
        """GPT-2's keys, then rotary_dim: even, positive, at most head_dim (transformers'
        null rotary_dim builds a table as wide as the hidden size, refused by name)."""
        base = super().from_hf(hf_config, **defaults)
        rotary_dim = hf_config.get("rotary_dim", defaults.get("rotary_dim"))
        if (not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool) or rotary_dim <= 0
                or rotary_dim % 2 or rotary_dim > base.head_dim):
            arch = (hf_config.get("architectures") or ["GPTJForCausalLM"])[0]
            raise ValueError(f"rotary_dim {rotary_dim!r} is not supported for {arch}: "
                             f"give an even number of dims up to head_dim {base.head_dim}")
        return dataclasses.replace(base, rotary_dim=rotary_dim)


class GPTJAttention(nn.Module):
    """Multi-head attention: bias-free q/k/v_proj and out_proj, interleaved partial RoPE."""

    def __init__(self, cfg: GPTJConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.scale = cfg.head_dim**-0.5
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(hidden).view(-1, self.num_heads, self.head_dim)
        v = self.v_proj(hidden).view(-1, self.num_heads, self.head_dim)
        q, k = apply_partial_rotary(q, k, rope, self.rotary_dim, apply_rotary_interleaved)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.out_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: q/k/v_proj by this rank's heads' rows, out_proj by columns."""
        shard_split_attention(sharder, prefix, self, "out_proj")


class GPTJBlock(nn.Module):
    """x + attn(ln_1(x)) + mlp(ln_1(x))."""

    attention_cls = GPTJAttention

    def __init__(self, cfg: GPTJConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.attn = self.attention_cls(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            ("fc_in", "fc_out"))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        normed = self.ln_1(hidden)
        return hidden + self.attn(normed, rope) + self.mlp(normed)


class GPTJModel(nn.Module):
    """wte, the blocks (h), ln_f, and the rotary table of the rotary dims."""

    block_cls = GPTJBlock

    def __init__(self, cfg: GPTJConfig, max_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.h = nn.ModuleList(self.block_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.rotary_emb = RotaryEmbedding(dataclasses.replace(cfg, head_dim=cfg.rotary_dim),
                                          max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.wte(input_ids)  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, rotary_dim]
        for block in self.h:
            hidden = block(hidden, rope)
        return self.ln_f(hidden)


class GPTJForCausalLM(CausalLM):
    """GPT-J for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden], a
    biased lm_head (its weight wte's where tie_word_embeddings); tensor parallelism by heads.
    Pipeline parallelism (no Llama layer loop) and LoRA (no o_proj, no gated MLP) are refused
    by name."""

    config_cls = GPTJConfig
    body_cls = GPTJModel
    body_name = "transformer"
    embed_name = "transformer.wte"  # split by vocab rows under tensor parallelism
    # transformers' GPTJConfig defaults (RoPE base 10000, every head's first rotary_dim dims)
    hf_defaults = {"n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16,
                   "rotary_dim": 64, "n_inner": None, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
                   "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}
    # GPT-2's keys that transformers' GPT-J never reads (it always scales by head_dim ** -0.5)
    hf_unread = ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention")
    ignored_weights = IGNORED_WEIGHTS  # the causal mask buffers older checkpoints saved

    def __init__(self, cfg: GPTJConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = self.body_cls(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
