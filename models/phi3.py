"""Phi-3 decoder (Phi-3, Phi-3.5 and Phi-4 mini): the Llama layout whose checkpoint holds q/k/v as
one qkv_proj and gate/up as one gate_up_proj. The modules keep HF's names, so the weight map
stays the identity, and each layer already has the 4 matmuls the horizontal fusion would make;
a sliding_window applies to every layer and partial_rotary_factor turns the leading dims of each
head (Phi-4 mini: 3/4), as in transformers' Phi3Model."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import ACTIVATIONS
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import apply_rotary, check_partial_rotary


@dataclasses.dataclass
class Phi3Config(DecoderConfig):
    """DecoderConfig whose rotary table covers rotary_dim = head_dim * partial_rotary_factor
    dims (every rope type: transformers' Phi-3 reads the factor for each)."""

    # a sequence reaching LongRoPE's original length is recomputed with the long factors
    # (transformers' Phi-3 drops its cache there): the engine does the same
    long_rope_recompute: ClassVar[bool] = True

    @property
    def rotary_dim(self) -> int:
        """The leading dims of a head that RoPE turns; the rest pass through."""
        return int(self.head_dim * self.rope_scaling.get("partial_rotary_factor", 1.0))

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Phi3Config:
        """transformers' Phi3Config reads the older rope types "su" and "yarn" as LongRoPE."""
        hf = dict(hf_config)
        for key in ("rope_scaling", "rope_parameters"):
            rope = hf.get(key)
            if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("su",
                                                                                    "yarn"):
                hf[key] = {**rope, "rope_type": "longrope", "type": "longrope"}
        return super().from_hf(hf, **defaults)

    @staticmethod
    def check_rotary(scaling: dict[str, Any], head_dim: int) -> None:
        """LongRoPE's factors: one per turned pair of the rotary dims."""
        check_partial_rotary(scaling, head_dim)


class Phi3Attention(LlamaAttention):
    """GQA self-attention with RoPE over one qkv_proj (q rows, then k, then v) and o_proj."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.rotary_dim = cfg.rotary_dim

    @property
    def q_size(self) -> int:
        """qkv_proj's q rows: num_heads * head_dim (the module's heads, whatever they are)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """qkv_proj's k rows, and its v rows: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D]: the rows of qkv_proj's one output."""
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], -1)
        return (q.view(-1, self.num_heads, self.head_dim),  # [T, H, D]
                k.view(-1, self.num_kv_heads, self.head_dim),  # [T, Hkv, D]
                v.view(-1, self.num_kv_heads, self.head_dim))

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on the leading rotary_dim dims of each head; the rest pass through."""
        if self.rotary_dim == self.head_dim:
            return apply_rotary(q, k, rope)
        dims = (self.rotary_dim, self.head_dim - self.rotary_dim)
        (q_rot, q_pass), (k_rot, k_pass) = q.split(dims, -1), k.split(dims, -1)
        q_rot, k_rot = apply_rotary(q_rot, k_rot, rope)  # [T, H, rotary_dim]
        return torch.cat([q_rot, q_pass], -1), torch.cat([k_rot, k_pass], -1)


class Phi3MLP(nn.Module):
    """down_proj(act(gate) * up) with gate and up the two halves of gate_up_proj's output."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act_fn = ACTIVATIONS[cfg.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(hidden).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(self.act_fn(gate) * up)


class Phi3DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with Phi3Attention and Phi3MLP."""

    attention_cls = Phi3Attention

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = Phi3MLP(cfg)


class Phi3Model(LlamaModel):
    """The Llama model with Phi-3 layers, its rotary table over the rotary dims."""

    layer_cls = Phi3DecoderLayer

    @staticmethod
    def rotary_config(cfg: Phi3Config) -> DecoderConfig:
        """The table of the rotary dims alone."""
        return dataclasses.replace(cfg, head_dim=cfg.rotary_dim)


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 for causal LM: the Llama contract over Phi3Model. LoRA adapters (of qkv_proj) are
    refused."""

    model_cls = Phi3Model
    config_cls = Phi3Config
    hf_defaults = {"rms_norm_eps": 1e-5}  # transformers' Phi3Config's
    # read by transformers' Phi3 classes: no biases, one window for every layer
    hf_unread = MOE_KEYS + ("attention_bias", "qkv_bias", "o_proj_bias", "mlp_bias",
                            "use_sliding_window", "max_window_layers", "layer_types")
