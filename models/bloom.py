"""Bloom decoder (BloomForCausalLM: bloom-560m .. bloom, bloomz): no position embedding but
ALiBi (the attention op's per-head slopes), a LayerNorm after the word embeddings, one fused
query_key_value laid out per head as [H, 3, D], a tanh-gelu MLP (dense_h_to_4h, dense_4h_to_h),
and the residual taken after each LayerNorm where apply_residual_connection_post_layernorm."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.alibi import bloom_alibi_slopes
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.fused_heads import shard_grouped_qkv
from compiled_llm.models.layers import CausalLM, DenseMLP, LMHead

_ALIASES = {"n_embed": "hidden_size", "n_layer": "num_hidden_layers",
            "n_head": "num_attention_heads"}


@dataclasses.dataclass
class BloomConfig(DecoderConfig):
    """DecoderConfig read from Bloom's spelling, plus its LayerNorm eps and where the residual
    is taken (apply_residual_connection_post_layernorm)."""

    layer_norm_epsilon: float = 1e-5
    apply_residual_connection_post_layernorm: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> BloomConfig:
        """The keys transformers' BloomConfig reads (its attribute_map's short names too)."""
        hf = {**{new: hf_config[old] for old, new in _ALIASES.items() if old in hf_config},
              **hf_config}

        def get(key: str) -> Any:
            return hf.get(key, defaults.get(key))

        if (get("pretraining_tp") or 1) > 1 and get("slow_but_exact"):
            raise ValueError("slow_but_exact=True with pretraining_tp > 1 is not supported for "
                             "BloomForCausalLM (transformers' sliced path drops the dense "
                             "biases)")
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        base = DecoderConfig.from_hf({
            "vocab_size": hf["vocab_size"], "hidden_size": hidden,
            "intermediate_size": 4 * hidden, "num_hidden_layers": get("num_hidden_layers"),
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "tie_word_embeddings": get("tie_word_embeddings"),
            "hidden_act": "gelu_pytorch_tanh", "attention_bias": True, "mlp_bias": True,
            "architectures": hf.get("architectures")})
        post = bool(get("apply_residual_connection_post_layernorm"))
        return cls(**vars(base), layer_norm_epsilon=get("layer_norm_epsilon"),
                   apply_residual_connection_post_layernorm=post)


class BloomAttention(nn.Module):
    """Multi-head attention over query_key_value ([H, 3, D] rows) with ALiBi, and a dense."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int, slopes: torch.Tensor) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.register_buffer("alibi_slopes", slopes, persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        qkv = self.query_key_value(hidden).view(-1, self.num_heads, 3, self.head_dim)
        q, k, v = qkv.unbind(2)  # [T, H, D] each
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1, True, 0.0, None,
                             self.alibi_slopes)
        return self.dense(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: this rank's heads' [3, D] rows of query_key_value (one
        contiguous run) and their ALiBi slopes, dense by columns."""
        shard_grouped_qkv(sharder, prefix, self, "query_key_value", "dense")


class BloomBlock(nn.Module):
    """ln -> attention + residual -> ln -> MLP + residual, the residual being each LayerNorm's
    input, or its output where apply_residual_connection_post_layernorm."""

    def __init__(self, cfg: BloomConfig, layer_idx: int) -> None:
        super().__init__()
        self.post_norm_residual = cfg.apply_residual_connection_post_layernorm
        eps = cfg.layer_norm_epsilon
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.self_attention = BloomAttention(cfg, layer_idx,
                                             bloom_alibi_slopes(cfg.num_attention_heads))
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            ("dense_h_to_4h", "dense_4h_to_h"))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        normed = self.input_layernorm(hidden)
        residual = normed if self.post_norm_residual else hidden  # a config constant
        hidden = self.self_attention(normed) + residual
        normed = self.post_attention_layernorm(hidden)
        residual = normed if self.post_norm_residual else hidden
        return self.mlp(normed) + residual


class BloomModel(nn.Module):
    """word_embeddings, their LayerNorm, the blocks (h), ln_f."""

    def __init__(self, cfg: BloomConfig) -> None:
        super().__init__()
        eps = cfg.layer_norm_epsilon
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.word_embeddings_layernorm = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.h = nn.ModuleList(BloomBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden] (positions: ALiBi needs none)."""
        hidden = self.word_embeddings_layernorm(self.word_embeddings(input_ids))
        for block in self.h:
            hidden = block(hidden)
        return self.ln_f(hidden)


class BloomForCausalLM(CausalLM):
    """Bloom for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden], the
    head tied to word_embeddings; tensor parallelism by heads. Pipeline parallelism (no Llama
    layer loop) and LoRA (no q/k/v_proj) are refused by name."""

    config_cls = BloomConfig
    body_name = "transformer"
    embed_name = "transformer.word_embeddings"  # split by vocab rows under tensor parallelism
    # transformers' BloomConfig defaults
    hf_defaults = {"vocab_size": 250880, "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 8, "layer_norm_epsilon": 1e-5,
                   "apply_residual_connection_post_layernorm": False,
                   "tie_word_embeddings": True}
    # transformers' Bloom never reads these: no window, no experts
    hf_unread = WINDOW_KEYS + MOE_KEYS

    def __init__(self, cfg: BloomConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg  # max_len: ALiBi has no table to size
        self.transformer = BloomModel(cfg)
        self.lm_head = LMHead(cfg, self.transformer.word_embeddings)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name: a BloomModel checkpoint's (h.*,
        word_embeddings.*, as bloom-560m ships) gain transformers' prefix `transformer.`."""
        if not hf_name.startswith(("transformer.", "lm_head.")):
            return f"transformer.{hf_name}"
        return hf_name
