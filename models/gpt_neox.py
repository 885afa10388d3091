"""GPT-NeoX decoder (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B): LayerNorms with bias, one fused
query_key_value projection laid out per head as [H, 3, D], RoPE on the leading rotary_pct of
each head, a gelu MLP (dense_h_to_4h, dense_4h_to_h), and attention and MLP either in parallel
off the same residual (use_parallel_residual) or one after the other. Attention is the one
opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.config_fields import hf_rope_dict
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.fused_heads import shard_grouped_qkv
from compiled_llm.models.layers import CausalLM, DenseMLP, LMHead
from compiled_llm.models.rotary import PartialRotaryConfig, RotaryEmbedding, apply_partial_rotary


@dataclasses.dataclass
class GPTNeoXConfig(PartialRotaryConfig):
    """PartialRotaryConfig plus use_parallel_residual; rotary_pct and rotary_emb_base (the
    older spellings) read as transformers 5 reads them, 0.25 of each head by default."""

    use_parallel_residual: bool = True

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GPTNeoXConfig:
        """transformers' GPTNeoXConfig keys (5.x's rope_parameters or 4.x's rotary_pct)."""
        hf = dict(hf_config)
        heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
        if hf.get("head_dim") not in (None, hidden // heads):
            raise ValueError(f"head_dim {hf['head_dim']!r} is not supported for GPT-NeoX: "
                             f"its attention splits hidden_size into {hidden // heads}-dim heads")
        params = hf_rope_dict(hf)
        params.setdefault("rope_theta", hf.get("rotary_emb_base", 10000.0))
        params.setdefault("partial_rotary_factor", hf.get("rotary_pct", 0.25))
        hf.pop("rope_scaling", None)
        hf.pop("partial_rotary_factor", None)  # transformers' GPT-NeoX reads rotary_pct
        hf["rope_parameters"] = params
        hf["num_key_value_heads"] = heads  # no grouped-query attention
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, use_parallel_residual=bool(hf.get("use_parallel_residual", True)))


class GPTNeoXAttention(nn.Module):
    """Multi-head attention over one query_key_value projection and a dense output."""

    def __init__(self, cfg: GPTNeoXConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.scale = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=bias)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        qkv = self.query_key_value(hidden)  # [T, 3 * hidden]
        qkv = qkv.view(-1, self.num_heads, 3 * self.head_dim)  # [T, H, 3D]
        q, k, v = qkv.chunk(3, dim=-1)  # [T, H, D] each: the rows are [H, 3, D], not [3, H, D]
        q, k = apply_partial_rotary(q, k, rope, self.rotary_dim)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.dense(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: this rank's heads' [3, D] rows of query_key_value (one
        contiguous run), dense by columns (its bias added once, after the all-reduce)."""
        shard_grouped_qkv(sharder, prefix, self, "query_key_value", "dense")


class GPTNeoXLayer(nn.Module):
    """x + attn(ln1(x)) + mlp(ln2(x)) with use_parallel_residual, else the attention's
    residual sum feeds ln2 and the MLP."""

    def __init__(self, cfg: GPTNeoXConfig, layer_idx: int) -> None:
        super().__init__()
        self.use_parallel_residual = cfg.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = GPTNeoXAttention(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            ("dense_h_to_4h", "dense_4h_to_h"))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        attn_out = self.attention(self.input_layernorm(hidden), rope)
        if self.use_parallel_residual:  # a config constant: one graph per model
            return hidden + attn_out + self.mlp(self.post_attention_layernorm(hidden))
        hidden = hidden + attn_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class GPTNeoXModel(nn.Module):
    """embed_in, the layers, final_layer_norm, and the rotary table of the rotary dims."""

    def __init__(self, cfg: GPTNeoXConfig, max_len: int) -> None:
        super().__init__()
        self.embed_in = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GPTNeoXLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.rotary_emb = RotaryEmbedding(dataclasses.replace(cfg, head_dim=cfg.rotary_dim),
                                          max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_in(input_ids)  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, rotary_dim]
        for layer in self.layers:
            hidden = layer(hidden, rope)
        return self.final_layer_norm(hidden)


class GPTNeoXForCausalLM(CausalLM):
    """GPT-NeoX for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden].
    Checkpoints name the head embed_out (transformers 5: lm_head). Tensor parallelism by
    heads; pipeline parallelism (no Llama layer loop) and LoRA (no q/k/v_proj) are refused by
    name."""

    config_cls = GPTNeoXConfig
    body_name = "gpt_neox"
    embed_name = "gpt_neox.embed_in"  # the table tensor parallelism splits by vocab rows
    hf_defaults = {"attention_bias": True, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
                   "max_position_embeddings": 2048, "tie_word_embeddings": False}
    # transformers' GPT-NeoX never reads these: no grouped-query heads, no window, the MLP
    # always biased
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("num_key_value_heads", "qkv_bias", "o_proj_bias",
                                          "mlp_bias", "rms_norm_eps")
    # buffers older checkpoints saved (transformers ignores them too)
    ignored_weights = (".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq")

    def __init__(self, cfg: GPTNeoXConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.gpt_neox = GPTNeoXModel(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = LMHead(cfg, self.gpt_neox.embed_in)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name (embed_out -> lm_head), or None."""
        if hf_name.endswith(cls.ignored_weights):
            return None
        return "lm_head.weight" if hf_name == "embed_out.weight" else hf_name
