"""Llama-family decoder in plain PyTorch: Llama 2/3/3.1/3.2, Mistral and Qwen2 (and the layout
its mixture-of-experts relatives share: a layer's MLP is a sparse MoE block where cfg.moe says).

Module names mirror HF's, so the weight map is the identity. forward takes a flat token batch
[T] with positions [T]; attention (and a MoE layer's expert dispatch) is the only opaque op.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import CausalLM, LMHead, RMSNorm
from compiled_llm.models.moe import moe_or_dense_mlp
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary


class LlamaAttention(nn.Module):
    """Self-attention with GQA and RoPE; owns q/k/v/o_proj and calls the attention op."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = cfg.layer_window(layer_idx)
        self.causal = True  # False: an encoder's bidirectional attention (no KV cache)
        q_size, kv_size = self.num_heads * cfg.head_dim, self.num_kv_heads * cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=cfg.o_proj_bias)

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hook for the projections (one fused qkv_proj, norms over a whole projection):
        hidden [T, hidden] -> q [T, H, D], k and v [T, Hkv, D]."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)
        return q, k, v

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook for per-head q/k norms (Qwen3); identity here."""
        return q, k

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Hook for how RoPE applies (partial, or not on some layers); every dim here."""
        return apply_rotary(q, k, rope)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(*self.qk_norm(q, k), rope)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window,
                             self.causal)
        return self.o_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]


class LlamaDecoderLayer(nn.Module):
    """Pre-norm decoder layer; the residual add rides in the next norm (fused add + norm)."""

    attention_cls = LlamaAttention

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = moe_or_dense_mlp(cfg, layer_idx)  # GatedMLP unless the config routes it
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (MLP output, residual stream without it); the next norm adds
        the two (residual is None for the first layer)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Embedding, the decoder layers, the final norm, and the rotary table they share."""

    layer_cls = LlamaDecoderLayer

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(self.rotary_config(cfg), max_len)

    @staticmethod
    def rotary_config(cfg: DecoderConfig) -> DecoderConfig:
        """The config the rotary table is built from (every dim of a head turns)."""
        return cfg

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, D]
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, rope)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LayersOfSlots:
    """Mixin before a LlamaModel subclass whose decoder layers each hold several attention
    calls (cfg.num_hidden_layers counts the cache slots, cfg.num_layers the layers): the
    Llama loop over cfg.num_layers layers, under its own forward, as a pipeline stage's split
    of the slots would not fit (refused by name)."""

    def __init__(self, cfg, max_len: int) -> None:
        super().__init__(dataclasses.replace(cfg, num_hidden_layers=cfg.num_layers), max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        return LlamaModel.forward(self, input_ids, positions)


class LlamaForCausalLM(CausalLM):
    """The model contract: forward(input_ids [T], positions [T]) -> hidden [T, hidden]."""

    model_cls = LlamaModel
    hf_defaults: dict = {}
    # config.json keys transformers' class never reads: the loader drops them (so a stray
    # sliding_window on a Llama config changes nothing, as in HF), and hf_defaults apply
    hf_unread: tuple[str, ...] = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
    # checkpoint names that carry no parameter of ours: buffers some exporters save (RoPE
    # tables of ColossalAI-trained models among them; vLLM skips the same three)
    ignored_weights = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")

    def __init__(self, cfg: DecoderConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.model_cls(cfg, max_len or cfg.max_position_embeddings)
        self.lm_head = LMHead(cfg, self.model.embed_tokens)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: the Llama layout without biases; its sliding window (HF's default 4096) is on
    every layer, unless config.json has layer_types (transformers then loads it as Ministral,
    whose layer_types say which layers slide)."""

    hf_defaults = {"sliding_window": 4096}
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "attention_bias",
                            "qkv_bias", "o_proj_bias", "mlp_bias")


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: the Llama layout with biased q/k/v projections (o_proj has none)."""

    hf_defaults = {"attention_bias": True, "o_proj_bias": False, "use_sliding_window": False,
                   "max_window_layers": 28}
    hf_unread = MOE_KEYS + ("attention_bias", "qkv_bias", "o_proj_bias", "mlp_bias")
