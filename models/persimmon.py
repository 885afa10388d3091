"""Persimmon decoder (PersimmonForCausalLM: adept/persimmon-8b, Fuyu's language model): the
Llama body's layer loop with LayerNorms, one biased query_key_value projection laid out per head
as [H, 3, D] (multi-head, no GQA), LayerNorms over each head of q and k (qk_layernorm), RoPE on
the leading partial_rotary_factor of each head (half by default) and a biased ungated relu2 MLP
(dense_h_to_4h, dense_4h_to_h). Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.fused_heads import shard_grouped_qkv
from compiled_llm.models.layers import DenseMLP, LayerNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.rotary import PartialRotaryConfig, apply_partial_rotary


@dataclasses.dataclass
class PersimmonConfig(PartialRotaryConfig):
    """PartialRotaryConfig plus qk_layernorm (on by default); heads of hidden_size /
    num_attention_heads dims, as many K/V heads as query heads, every projection biased."""

    qk_layernorm: bool = True

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> PersimmonConfig:
        """transformers' PersimmonConfig keys: partial_rotary_factor 0.5 unless the config
        says; a head_dim other than hidden_size / num_attention_heads refused by name."""
        hf = dict(hf_config)
        heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
        if hf.get("head_dim") not in (None, hidden // heads):
            raise ValueError(f"head_dim {hf['head_dim']!r} is not supported for Persimmon: its "
                             f"attention splits hidden_size into {hidden // heads}-dim heads")
        hf.setdefault("partial_rotary_factor", 0.5)  # read where rope_parameters lacks it
        hf.update(head_dim=hidden // heads, num_key_value_heads=heads, attention_bias=True,
                  o_proj_bias=True, mlp_bias=True)  # every projection is biased
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, qk_layernorm=bool(hf.get("qk_layernorm", defaults.get("qk_layernorm", True))))


class PersimmonAttention(nn.Module):
    """Multi-head attention over one query_key_value projection ([H, 3, D] rows), optional
    LayerNorms over each head of q and k (one weight for all heads), partial RoPE, and dense."""

    def __init__(self, cfg: PersimmonConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.rotary_dim, self.qk_layernorm = cfg.rotary_dim, cfg.qk_layernorm
        self.scale = cfg.head_dim**-0.5
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        if cfg.qk_layernorm:
            self.q_layernorm = nn.LayerNorm(cfg.head_dim, eps=cfg.layer_norm_eps)
            self.k_layernorm = nn.LayerNorm(cfg.head_dim, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        qkv = self.query_key_value(hidden).view(-1, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.chunk(3, dim=-1)  # [T, H, D] each: the rows are [H, 3, D], not [3, H, D]
        if self.qk_layernorm:  # a config constant: one graph per model
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = apply_partial_rotary(q, k, rope, self.rotary_dim)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.dense(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: this rank's heads' [3, D] rows of query_key_value (one
        contiguous run), dense by columns; the per-head q/k LayerNorms stay whole."""
        shard_grouped_qkv(sharder, prefix, self, "query_key_value", "dense")


class PersimmonDecoderLayer(LlamaDecoderLayer):
    """The Llama layer's residual stream with LayerNorms, Persimmon's attention and the biased
    ungated MLP."""

    attention_cls = PersimmonAttention

    def __init__(self, cfg: PersimmonConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)  # not Llama's modules: no q/k/v_proj, no gated MLP
        self.self_attn = PersimmonAttention(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("dense_h_to_4h", "dense_4h_to_h"))
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class PersimmonModel(LlamaModel):
    """The Llama body over Persimmon layers: a LayerNorm at the end (the checkpoint's
    final_layernorm), the rotary table of the rotary dims."""

    layer_cls = PersimmonDecoderLayer

    def __init__(self, cfg: PersimmonConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    @staticmethod
    def rotary_config(cfg: PersimmonConfig) -> PersimmonConfig:
        """The table of the rotary dims alone."""
        return dataclasses.replace(cfg, head_dim=cfg.rotary_dim)


class PersimmonForCausalLM(LlamaForCausalLM):
    """Persimmon for causal LM: the Llama contract over PersimmonModel (pipeline parallelism
    as Llama's), tensor parallelism by heads; LoRA is refused by the q_proj it lacks."""

    model_cls = PersimmonModel
    config_cls = PersimmonConfig
    # transformers' PersimmonConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "relu2", "layer_norm_eps": 1e-5, "qk_layernorm": True,
                   "max_position_embeddings": 16384, "tie_word_embeddings": False}
    # transformers' Persimmon never reads these: no window, no GQA, biases everywhere
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("num_key_value_heads", "attention_bias", "qkv_bias",
                                          "o_proj_bias", "mlp_bias", "rms_norm_eps")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name (final_layernorm -> norm), or None."""
        if hf_name.startswith("model.final_layernorm."):
            return "model.norm." + hf_name.rsplit(".", 1)[1]
        return super().weight_name(hf_name)
