"""MPT decoder (MptForCausalLM: mpt-7b, mpt-30b and their tunes): ALiBi (the attention op's
per-head slopes, MPT's form), bias-free LayerNorms and linears, q/k/v as the three thirds of
one Wqkv (optionally clamped: clip_qkv), an exact-gelu MLP (up_proj, down_proj), a tied head."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.alibi import mpt_alibi_slopes
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.fused_heads import shard_stacked_qkv
from compiled_llm.models.layers import CausalLM, DenseMLP, LMHead

# attn_config entries transformers' MPT never reads, with the value its layers implement
_FIXED_ATTN = {"attn_type": "multihead_attention", "qk_ln": False, "alibi": True,
               "alibi_bias_max": 8, "prefix_lm": False, "rope": False,
               "sliding_window_size": -1}
_FIXED = {"expansion_ratio": 4, "no_bias": True, "logit_scale": None}


@dataclasses.dataclass
class MptConfig(DecoderConfig):
    """DecoderConfig read from MPT's spelling (d_model, n_heads, n_layers, attn_config), plus
    its LayerNorm eps, softmax_scale and clip_qkv."""

    layer_norm_epsilon: float = 1e-5
    softmax_scale: float | None = None
    clip_qkv: float | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> MptConfig:
        """The keys transformers' MptConfig reads; ValueError naming an entry its layers would
        ignore yet the checkpoint was trained with (MPT's own code reads them)."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        attn = get("attn_config") or {}
        if not isinstance(attn, dict):
            attn = attn.to_dict()
        _check_fixed({**_FIXED_ATTN, **attn}, _FIXED_ATTN, "attn_config.")
        _check_fixed({key: get(key) for key in _FIXED}, _FIXED, "")
        hidden, heads = get("d_model"), get("n_heads")
        base = DecoderConfig.from_hf({
            "vocab_size": get("vocab_size"), "hidden_size": hidden,
            "intermediate_size": 4 * hidden, "num_hidden_layers": get("n_layers"),
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "max_position_embeddings": get("max_seq_len"),
            "tie_word_embeddings": get("tie_word_embeddings"), "hidden_act": "gelu",
            "architectures": hf_config.get("architectures")})
        return cls(**vars(base), layer_norm_epsilon=get("layer_norm_epsilon"),
                   softmax_scale=attn.get("softmax_scale"), clip_qkv=attn.get("clip_qkv"))


def _check_fixed(values: dict[str, Any], fixed: dict[str, Any], prefix: str) -> None:
    for key, expected in fixed.items():
        if values.get(key, expected) != expected:
            raise ValueError(f"{prefix}{key}={values[key]!r} is not supported for "
                             f"MptForCausalLM (transformers' MPT runs {expected!r})")


class MptAttention(nn.Module):
    """Multi-head attention over Wqkv ([3, H, D] rows, clamped where clip_qkv) with ALiBi,
    and out_proj."""

    def __init__(self, cfg: MptConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.clip_qkv = layer_idx, cfg.clip_qkv
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.softmax_scale or cfg.head_dim**-0.5
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.register_buffer("alibi_slopes", mpt_alibi_slopes(self.num_heads),
                             persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        qkv = self.Wqkv(hidden)
        if self.clip_qkv:  # a config constant
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        q, k, v = qkv.view(-1, 3, self.num_heads, self.head_dim).unbind(1)  # [T, H, D] each
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1, True, 0.0, None,
                             self.alibi_slopes)
        return self.out_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]


class MptBlock(nn.Module):
    """x + attn(norm_1(x)), then + ffn(norm_2(.)); LayerNorms without bias."""

    def __init__(self, cfg: MptConfig, layer_idx: int) -> None:
        super().__init__()
        eps = cfg.layer_norm_epsilon
        self.norm_1 = nn.LayerNorm(cfg.hidden_size, eps=eps, bias=False)
        self.attn = MptAttention(cfg, layer_idx)
        self.norm_2 = nn.LayerNorm(cfg.hidden_size, eps=eps, bias=False)
        self.ffn = DenseMLP(cfg.hidden_size, cfg.intermediate_size, "gelu",
                            ("up_proj", "down_proj"), bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.attn(self.norm_1(hidden))
        return hidden + self.ffn(self.norm_2(hidden))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: this rank's heads' rows of each third of Wqkv and their ALiBi
        slopes, out_proj by columns; ffn's up_proj by rows, down_proj by columns."""
        shard_stacked_qkv(sharder, f"{prefix}.attn", self.attn, "Wqkv", "out_proj")
        sharder.ungated_mlp(f"{prefix}.ffn", self.ffn)


class MptModel(nn.Module):
    """wte, the blocks, norm_f (no position embedding: ALiBi)."""

    def __init__(self, cfg: MptConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(MptBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden] (positions: ALiBi needs none)."""
        hidden = self.wte(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        return self.norm_f(hidden)


class MptForCausalLM(CausalLM):
    """MPT for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden], the head
    tied to wte; tensor parallelism by heads. Pipeline parallelism (no Llama layer loop) and
    LoRA (no q/k/v_proj) are refused by name."""

    config_cls = MptConfig
    body_name = "transformer"
    embed_name = "transformer.wte"  # split by vocab rows under tensor parallelism
    # transformers' MptConfig defaults
    hf_defaults = {"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048,
                   "vocab_size": 50368, "layer_norm_epsilon": 1e-5, "expansion_ratio": 4,
                   "no_bias": True, "logit_scale": None, "tie_word_embeddings": True}
    # transformers' MPT never reads these: no window, no experts
    hf_unread = WINDOW_KEYS + MOE_KEYS

    def __init__(self, cfg: MptConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg  # max_len: ALiBi has no table to size
        self.transformer = MptModel(cfg)
        self.lm_head = LMHead(cfg, self.transformer.wte)
