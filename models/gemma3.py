"""Gemma 3 text decoder (Gemma3ForCausalLM: Gemma 3 270M and 1B, the text stack of the larger
ones): embeddings scaled by sqrt(hidden_size), RMSNorms whose weight is an offset from 1 (scaled
in float32, cast after), norms after attention and around the MLP, per-head q/k norms, a GELU
gate, query_pre_attn_scalar's scale, sliding layers on their own RoPE base, and an optional
final logit soft-cap. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import Float32ScaleRMSNorm, GatedMLP, SoftCappedLogits
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM
from compiled_llm.models.rotary import RotaryEmbedding, local_rotary_embedding

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass
class Gemma3Config(DecoderConfig):
    """DecoderConfig plus Gemma 3's own keys; rope_theta and rope_scaling are the full-attention
    layers', local_rope_theta the sliding layers' (their rope is the default one)."""

    query_pre_attn_scalar: float = 256.0
    local_rope_theta: float = 10000.0
    final_logit_softcapping: float | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Gemma3Config:
        """transformers' Gemma3TextConfig keys, in its 5.x spelling (rope_parameters per
        layer type) or 4.x's (rope_theta, rope_local_base_freq, sliding_window_pattern)."""
        hf = dict(hf_config)
        for key, why in (("attn_logit_softcapping", "soft-capped attention scores"),
                         ("use_bidirectional_attention", "bidirectional attention")):
            if hf.get(key):
                raise ValueError(f"{key}={hf[key]!r}: {why} are not supported")
        local_theta = split_layer_rope(hf, defaults)
        hf["hidden_act"] = hf.get("hidden_activation") or "gelu_pytorch_tanh"
        if not hf.get("layer_types"):  # 4.x: every pattern-th layer attends fully
            pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
            hf["layer_types"] = [FULL if (i + 1) % pattern == 0 else SLIDING
                                 for i in range(hf["num_hidden_layers"])]
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, local_rope_theta=float(local_theta),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 256),
            final_logit_softcapping=hf.get("final_logit_softcapping"))


@dataclasses.dataclass
class Gemma3EmbeddingConfig(Gemma3Config):
    """Gemma3Config that takes use_bidirectional_attention (EmbeddingGemma's encoder: every
    key visible, the sliding layers' within sliding_window on either side)."""

    bidirectional: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Gemma3EmbeddingConfig:
        """Gemma3Config.from_hf, with use_bidirectional_attention read."""
        hf = dict(hf_config)
        bidirectional = bool(hf.pop("use_bidirectional_attention", False))
        if bidirectional and hf.get("sliding_window"):
            # transformers' reading: config.json's window spans both sides, |q - k| < w // 2 + 1
            hf["sliding_window"] = hf["sliding_window"] // 2 + 1
        return dataclasses.replace(super().from_hf(hf, **defaults), bidirectional=bidirectional)


def split_layer_rope(hf: dict[str, Any], defaults: dict[str, Any]) -> float:
    """Leave the full-attention layers' rope in hf (rope_parameters, as one dict) and return
    the sliding layers' base; their rope must be the default one."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and (FULL in params or SLIDING in params):
        local = params.get(SLIDING) or {}
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters.{SLIDING}.rope_type "
                             f"{local['rope_type']!r} is not supported (default only)")
        hf["rope_parameters"] = params.get(FULL) or {"rope_type": "default"}
        return local.get("rope_theta", defaults["rope_local_base_freq"])
    return hf.get("rope_local_base_freq", defaults["rope_local_base_freq"])


def gemma_rms_norm(dim: int, eps: float) -> Float32ScaleRMSNorm:
    """Gemma's RMSNorm: its weight is an offset from 1."""
    return Float32ScaleRMSNorm(dim, eps, offset=1.0)


class Gemma3Attention(LlamaAttention):
    """LlamaAttention with Gemma's per-head q_norm/k_norm before RoPE and the scale of
    query_pre_attn_scalar (not head_dim)."""

    def __init__(self, cfg: Gemma3Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.causal = not getattr(cfg, "bidirectional", False)
        self.q_norm = gemma_rms_norm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = gemma_rms_norm(cfg.head_dim, cfg.rms_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D], each head normalised over D."""
        return self.q_norm(q), self.k_norm(k)


class Gemma3DecoderLayer(nn.Module):
    """Norm, attention, norm, residual add; norm, MLP, norm, residual add."""

    attention_cls: type[nn.Module] = Gemma3Attention

    def __init__(self, cfg: Gemma3Config, layer_idx: int) -> None:
        super().__init__()
        self.sliding = cfg.layer_window(layer_idx) > 0
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)
        for name in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            setattr(self, name, gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps))

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        attn = self.self_attn(self.input_layernorm(hidden), rope)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


class GemmaScaledModel(nn.Module):
    """Gemma's stack: the embedding scaled by sqrt(hidden_size), layer_cls's layers on one
    rotary table, the final (1 + weight) norm."""

    layer_cls: type[nn.Module]

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(hidden_size) rounded to the weights' dtype first, as transformers' Gemmas do
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size**0.5), persistent=False)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)

    def ropes(self, positions: torch.Tensor) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) [T, 1, D] for sliding layers (True) and full ones: one table here."""
        rope = self.rotary_emb(positions)
        return {False: rope, True: rope}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        hidden = hidden * self.embed_scale.to(hidden.dtype)
        ropes = self.ropes(positions)
        for layer in self.layers:
            hidden = layer(hidden, ropes[layer.sliding])
        return self.norm(hidden)


class Gemma3Model(GemmaScaledModel):
    """GemmaScaledModel with the sliding layers on their own rotary table."""

    layer_cls = Gemma3DecoderLayer

    def __init__(self, cfg: Gemma3Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.local_rotary_emb = local_rotary_embedding(cfg, max_len)

    def ropes(self, positions: torch.Tensor) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """The full layers' table (False) and the sliding layers' (True)."""
        return {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}


class Gemma3ForCausalLM(SoftCappedLogits, LlamaForCausalLM):
    """Gemma 3 for causal LM: the Llama contract over Gemma3Model, logits soft-capped where
    final_logit_softcapping is set. Pipeline parallelism is refused by name (its body is not
    LlamaModel's layer loop)."""

    model_cls = Gemma3Model
    config_cls = Gemma3Config
    hf_defaults = {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "head_dim": 256,
                   "sliding_window": 4096, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 131072}
    # transformers' Gemma 3 reads hidden_activation (hidden_act is Gemma 1's) and a window on
    # the sliding layers alone
    hf_unread = MOE_KEYS + ("hidden_act", "qkv_bias", "o_proj_bias", "mlp_bias",
                            "use_sliding_window", "max_window_layers")

    def __init__(self, cfg: Gemma3Config, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.softcap = cfg.final_logit_softcapping
