"""Phi decoder (PhiForCausalLM: phi-1, phi-1.5, phi-2): one LayerNorm per layer feeding
attention and MLP in parallel (x + attn(ln(x)) + mlp(ln(x))), biased q/k/v and dense output
projections, optional per-head LayerNorms on q and k (qk_layernorm), RoPE on the leading
partial_rotary_factor of each head (0.5 by default), a gelu_new MLP (fc1, fc2) and a biased
lm_head. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.config_fields import hf_rope_dict
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.fused_heads import shard_split_attention
from compiled_llm.models.layers import CausalLM, DenseMLP
from compiled_llm.models.rotary import PartialRotaryConfig, RotaryEmbedding, apply_partial_rotary


@dataclasses.dataclass
class PhiConfig(PartialRotaryConfig):
    """PartialRotaryConfig plus qk_layernorm; every projection is biased, as transformers'
    Phi builds them whatever the config says."""

    qk_layernorm: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> PhiConfig:
        """transformers' PhiConfig keys: partial_rotary_factor 0.5 unless the config says."""
        hf = dict(hf_config)
        params = hf_rope_dict(hf)
        params.setdefault("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5))
        hf.pop("rope_scaling", None)
        hf["rope_parameters"] = params
        hf["attention_bias"] = True
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, qk_layernorm=bool(hf.get("qk_layernorm", False)))


class PhiAttention(nn.Module):
    """GQA self-attention with biased q/k/v_proj and dense, optional per-head q/k
    LayerNorms before a partial RoPE."""

    def __init__(self, cfg: PhiConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.rotary_dim = cfg.head_dim, cfg.rotary_dim
        self.scale = cfg.head_dim**-0.5
        q_size, kv_size = self.num_heads * cfg.head_dim, self.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_size)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size)
        self.dense = nn.Linear(q_size, cfg.hidden_size)
        self.qk_layernorm = cfg.qk_layernorm
        if cfg.qk_layernorm:
            self.q_layernorm = nn.LayerNorm(cfg.head_dim, eps=cfg.layer_norm_eps)
            self.k_layernorm = nn.LayerNorm(cfg.head_dim, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_layernorm:  # a config constant: one graph per model
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = apply_partial_rotary(q, k, rope, self.rotary_dim)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.dense(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: q_proj by this rank's heads' rows, k/v_proj by the KV heads
        they read, dense by columns; the per-head q/k LayerNorms stay whole."""
        shard_split_attention(sharder, prefix, self, "dense")


class PhiDecoderLayer(nn.Module):
    """x + attn(ln(x)) + mlp(ln(x)): one input_layernorm, attention and MLP in parallel."""

    def __init__(self, cfg: PhiConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = PhiAttention(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        normed = self.input_layernorm(hidden)
        return hidden + self.self_attn(normed, rope) + self.mlp(normed)


class PhiModel(nn.Module):
    """embed_tokens, the layers, final_layernorm, and the rotary table of the rotary dims."""

    def __init__(self, cfg: PhiConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(PhiDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.rotary_emb = RotaryEmbedding(dataclasses.replace(cfg, head_dim=cfg.rotary_dim),
                                          max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, rotary_dim]
        for layer in self.layers:
            hidden = layer(hidden, rope)
        return self.final_layernorm(hidden)


class PhiForCausalLM(CausalLM):
    """Phi for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden], a
    biased lm_head (its weight the embedding's where tie_word_embeddings); tensor parallelism
    by heads. Pipeline parallelism is refused by name, and LoRA (no o_proj, no gated MLP) by
    the module it lacks."""

    config_cls = PhiConfig
    hf_defaults = {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5,
                   "max_position_embeddings": 2048, "tie_word_embeddings": False}
    # transformers' Phi never reads these: biases everywhere, no window
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("attention_bias", "qkv_bias", "o_proj_bias",
                                          "mlp_bias", "rms_norm_eps")
    ignored_weights = ("rotary_emb.inv_freq",)

    def __init__(self, cfg: PhiConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = PhiModel(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
