"""OLMo 2 decoder (Olmo2ForCausalLM): the Llama projections with the norms moved after each
block (the attention's and the MLP's outputs are normed before their residual add; no input
norms), q and k normed over the whole projection before RoPE, and RMSNorms that scale in
float32 and cast after."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import Float32ScaleRMSNorm, GatedMLP
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM
from compiled_llm.models.rotary import RotaryEmbedding


class Olmo2Attention(LlamaAttention):
    """LlamaAttention with q_norm / k_norm over the whole q and k projections, before RoPE."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_norm = Float32ScaleRMSNorm(self.num_heads * self.head_dim, cfg.rms_norm_eps)
        self.k_norm = Float32ScaleRMSNorm(self.num_kv_heads * self.head_dim, cfg.rms_norm_eps)

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D], q and k normed before the heads are split."""
        q = self.q_norm(self.q_proj(hidden)).view(-1, self.num_heads, self.head_dim)
        k = self.k_norm(self.k_proj(hidden)).view(-1, self.num_kv_heads, self.head_dim)
        return q, k, self.v_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)


class Olmo2DecoderLayer(nn.Module):
    """Attention, its norm, the residual add; MLP, its norm, the residual add (attention_cls
    and norm_cls: a post-norm relative's own, EXAONE 4.0's)."""

    attention_cls: type[nn.Module] = Olmo2Attention
    norm_cls: type[nn.Module] = Float32ScaleRMSNorm

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
        self.post_attention_layernorm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.post_attention_layernorm(self.self_attn(hidden, rope))
        return hidden + self.post_feedforward_layernorm(self.mlp(hidden))


class Olmo2Model(nn.Module):
    """Embedding, the post-norm layers, the final norm, and the rotary table they share."""

    layer_cls: type[nn.Module] = Olmo2DecoderLayer
    norm_cls: type[nn.Module] = Float32ScaleRMSNorm

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary_emb(positions)  # (cos, sin) [T, 1, D]
        for layer in self.layers:
            hidden = layer(hidden, rope)
        return self.norm(hidden)


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 for causal LM: the Llama contract over Olmo2Model. Pipeline parallelism is
    refused by name (its body is not LlamaModel's layer loop)."""

    model_cls = Olmo2Model
    hf_defaults = {"rms_norm_eps": 1e-5}
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
