"""Falcon decoder (FalconForCausalLM: Falcon-7B, Falcon-40B/180B): one fused query_key_value
laid out per KV group as [q..., k, v] (multi_query: one group; the oldest layout: one group per
head), RoPE on every dim, a gelu MLP (dense_h_to_4h, dense_4h_to_h), attention and MLP in
parallel off one LayerNorm, off two (ln_attn, ln_mlp: new_decoder_architecture), or one after
the other; ALiBi in place of RoPE where `alibi` (Falcon-RW). Attention is the one opaque op."""

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
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary

_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor")


@dataclasses.dataclass
class FalconConfig(DecoderConfig):
    """DecoderConfig plus Falcon's layer_norm_epsilon, new_decoder_architecture,
    parallel_attn and two_norms (num_ln_in_parallel_attn 2); num_key_value_heads is the number
    of [q..., k, v] groups in query_key_value."""

    layer_norm_epsilon: float = 1e-5
    new_decoder_architecture: bool = False
    parallel_attn: bool = True
    two_norms: bool = False
    alibi: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> FalconConfig:
        """The keys transformers' FalconConfig reads (n_embed too); ValueError naming the
        layouts its FalconDecoderLayer cannot run."""
        # transformers' FalconConfig.attribute_map: the older spellings name the same keys
        hf_config = {**{new: hf_config[old] for old, new in _ALIASES.items() if old in hf_config},
                     **hf_config}

        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        hidden, heads = get("n_embed") or get("hidden_size"), get("num_attention_heads")
        new_arch, parallel = bool(get("new_decoder_architecture")), bool(get("parallel_attn"))
        kv_heads, num_ln = get("num_kv_heads") or heads, get("num_ln_in_parallel_attn")
        _check_layout(new_arch, parallel, bool(get("multi_query")), kv_heads, heads, num_ln)
        groups = kv_heads if new_arch else 1 if get("multi_query") else heads
        base = DecoderConfig.from_hf({
            "vocab_size": hf_config["vocab_size"], "hidden_size": hidden,
            "intermediate_size": get("ffn_hidden_size") or 4 * hidden,
            "num_hidden_layers": get("num_hidden_layers"), "num_attention_heads": heads,
            "num_key_value_heads": groups, "head_dim": hidden // heads,
            "max_position_embeddings": get("max_position_embeddings"),
            "tie_word_embeddings": get("tie_word_embeddings"), "hidden_act": get("activation"),
            "attention_bias": bool(get("bias")), "architectures": hf_config.get("architectures"),
            **{key: hf_config[key] for key in _ROPE_KEYS if key in hf_config}}, **defaults)
        return cls(**vars(base), layer_norm_epsilon=get("layer_norm_epsilon"),
                   new_decoder_architecture=new_arch, parallel_attn=parallel,
                   two_norms=new_arch and num_ln in (None, 2), alibi=bool(get("alibi")))


_ALIASES = {"n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
            "n_head_kv": "num_kv_heads"}


def _check_layout(new_arch: bool, parallel: bool, multi_query: bool, kv_heads: int, heads: int,
                  num_ln: int | None) -> None:
    """ValueError naming a field whose value transformers' Falcon layer cannot run."""
    if new_arch and not parallel:
        raise ValueError("parallel_attn=False is not supported with new_decoder_architecture "
                         "for FalconForCausalLM (transformers' layer has no serial form of it)")
    if num_ln == 2 and not new_arch and parallel:
        raise ValueError("num_ln_in_parallel_attn=2 is not supported without "
                         "new_decoder_architecture for FalconForCausalLM")
    if num_ln not in (None, 1, 2):
        raise ValueError(f"num_ln_in_parallel_attn {num_ln!r} is not supported for "
                         "FalconForCausalLM; have 1 or 2")
    if new_arch and heads % kv_heads:
        raise ValueError(f"num_kv_heads {kv_heads} must divide num_attention_heads {heads}")
    if not new_arch and not multi_query and kv_heads != heads:
        raise ValueError(f"num_kv_heads {kv_heads} is not supported without "
                         "new_decoder_architecture or multi_query: query_key_value holds "
                         f"k and v for each of the {heads} heads")


class FalconAttention(nn.Module):
    """GQA self-attention over one query_key_value ([Hkv, H/Hkv + 2, D] rows) and a dense."""

    def __init__(self, cfg: FalconConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, qkv_size, bias=cfg.attention_bias)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)
        # transformers rounds the slopes to bf16 and scales the bias with q.k (None: RoPE);
        # it also rounds each slope * key position to bf16, which the op computes exactly
        slopes = bloom_alibi_slopes(self.num_heads).bfloat16().float() * self.scale
        self.register_buffer("alibi_slopes", slopes if cfg.alibi else None, persistent=False)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        group = self.num_heads // self.num_kv_heads + 2
        qkv = self.query_key_value(hidden).view(-1, self.num_kv_heads, group, self.head_dim)
        q = qkv[:, :, :-2].flatten(1, 2)  # [T, Hkv, H/Hkv + 2, D] -> [T, H, D]
        k, v = qkv[:, :, -2], qkv[:, :, -1]  # [T, Hkv, D] each
        if self.alibi_slopes is None:  # a config constant: ALiBi models have no RoPE
            q, k = apply_rotary(q, k, rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1, True, 0.0, None,
                             self.alibi_slopes)
        return self.dense(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: this rank's KV groups of query_key_value whole, or, with fewer
        groups than ranks (multi_query), its q heads' rows and its group's k and v (replicated);
        the ALiBi slopes of its heads; dense by columns."""
        shard_grouped_qkv(sharder, prefix, self, "query_key_value", "dense")


class FalconDecoderLayer(nn.Module):
    """x + attn(ln(x)) + mlp(ln(x)) off one input_layernorm (parallel_attn), or off ln_attn
    and ln_mlp (two_norms), else attention then MLP, each after its own LayerNorm."""

    def __init__(self, cfg: FalconConfig, layer_idx: int) -> None:
        super().__init__()
        self.parallel_attn, self.two_norms = cfg.parallel_attn, cfg.two_norms
        self.self_attention = FalconAttention(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            ("dense_h_to_4h", "dense_4h_to_h"), cfg.attention_bias)
        eps = cfg.layer_norm_epsilon
        names = (("ln_attn", "ln_mlp") if cfg.two_norms else ("input_layernorm",) if
                 cfg.parallel_attn else ("input_layernorm", "post_attention_layernorm"))
        for name in names:
            setattr(self, name, nn.LayerNorm(cfg.hidden_size, eps=eps))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        if self.two_norms:  # config constants: one graph per model
            attn_out = self.self_attention(self.ln_attn(hidden), rope)
            return self.mlp(self.ln_mlp(hidden)) + attn_out + hidden
        normed = self.input_layernorm(hidden)
        attn_out = self.self_attention(normed, rope)
        if self.parallel_attn:
            return self.mlp(normed) + attn_out + hidden
        hidden = attn_out + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class FalconModel(nn.Module):
    """word_embeddings, the layers (h), ln_f, and the rotary table."""

    def __init__(self, cfg: FalconConfig, max_len: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.h = nn.ModuleList(FalconDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.word_embeddings(input_ids)  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, D]
        for layer in self.h:
            hidden = layer(hidden, rope)
        return self.ln_f(hidden)


class FalconForCausalLM(CausalLM):
    """Falcon for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden], the
    head tied to word_embeddings unless tie_word_embeddings is false; tensor parallelism by
    heads (a KV group shared by several ranks replicated). Pipeline parallelism (no Llama layer
    loop) and LoRA (no q/k/v_proj) are refused by name."""

    config_cls = FalconConfig
    body_name = "transformer"
    embed_name = "transformer.word_embeddings"  # split by vocab rows under tensor parallelism
    # transformers' FalconConfig defaults
    hf_defaults = {"num_hidden_layers": 32, "num_attention_heads": 71, "layer_norm_epsilon": 1e-5,
                   "num_kv_heads": None, "alibi": False, "new_decoder_architecture": False,
                   "multi_query": True, "parallel_attn": True, "bias": False,
                   "max_position_embeddings": 2048, "rope_theta": 10000.0,
                   "ffn_hidden_size": None, "activation": "gelu", "tie_word_embeddings": True,
                   "num_ln_in_parallel_attn": None, "hidden_size": 4544}
    # transformers' Falcon never reads these: no window, no experts
    hf_unread = WINDOW_KEYS + MOE_KEYS
    ignored_weights = ("rotary_emb.inv_freq",)

    def __init__(self, cfg: FalconConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = FalconModel(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = LMHead(cfg, self.transformer.word_embeddings)
