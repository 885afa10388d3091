"""StableLM decoder (StableLmForCausalLM: StableLM-3B-4E1T, StableLM 2 1.6B / 12B): the Llama
body's layer loop, q/k/v/o_proj and gated MLP, with LayerNorms (layer_norm_eps), RoPE on the
leading partial_rotary_factor of each head (a quarter by default), biased q/k/v where
use_qkv_bias, a LayerNorm of its own for every head of q and k where qk_layernorm, and attention
and MLP in parallel off one norm where use_parallel_residual. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.layers import LayerNorm, add_and_norm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.moe import ExpertWeight
from compiled_llm.models.rotary import PartialRotaryConfig, apply_partial_rotary

# transformers' per-head norms: a LayerNorm per head, `norms.<head>` of q_layernorm / k_layernorm
_HEAD_NORM = re.compile(r"^(?P<norm>.*\.self_attn\.[qk]_layernorm)\.norms\.(?P<head>\d+)\.weight$")


@dataclasses.dataclass
class StableLmConfig(PartialRotaryConfig):
    """PartialRotaryConfig plus qk_layernorm and use_parallel_residual; use_qkv_bias biases
    q/k/v (never o_proj nor the MLP)."""

    qk_layernorm: bool = False
    use_parallel_residual: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> StableLmConfig:
        """transformers' StableLmConfig keys: partial_rotary_factor 0.25 unless the config says;
        a head_dim other than hidden_size / num_attention_heads refused by name."""
        hf = dict(hf_config)
        heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
        if hf.get("head_dim") not in (None, hidden // heads):
            raise ValueError(f"head_dim {hf['head_dim']!r} is not supported for StableLM: its "
                             f"attention splits hidden_size into {hidden // heads}-dim heads")
        hf.setdefault("partial_rotary_factor", 0.25)  # read where rope_parameters lacks it
        hf.update(attention_bias=bool(hf.get("use_qkv_bias", False)), o_proj_bias=False,
                  mlp_bias=False, head_dim=hidden // heads)
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, qk_layernorm=bool(hf.get("qk_layernorm", False)),
            use_parallel_residual=bool(hf.get("use_parallel_residual", False)))


class PerHeadLayerNorm(nn.Module):
    """A LayerNorm without bias over each head's dims, each head its own weight: one [H, D]
    parameter (transformers holds H LayerNorms; weight_name stacks them)."""

    def __init__(self, num_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))
        self.eps = eps

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        """heads [T, H, D] -> [T, H, D]."""
        return F.layer_norm(heads, heads.shape[-1:], eps=self.eps) * self.weight


class StableLmAttention(LlamaAttention):
    """Llama's attention with optional per-head q/k LayerNorms and RoPE on the rotary dims."""

    def __init__(self, cfg: StableLmConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.rotary_dim, self.qk_layernorm = cfg.rotary_dim, cfg.qk_layernorm
        if cfg.qk_layernorm:
            self.q_layernorm = PerHeadLayerNorm(self.num_heads, self.head_dim, cfg.layer_norm_eps)
            self.k_layernorm = PerHeadLayerNorm(self.num_kv_heads, self.head_dim,
                                                cfg.layer_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head of q and k through its own LayerNorm where qk_layernorm."""
        if not self.qk_layernorm:  # a config constant: one graph per model
            return q, k
        return self.q_layernorm(q), self.k_layernorm(k)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on the leading rotary_dim dims of each head; the rest pass through."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim)


class StableLmDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (its GatedMLP) with LayerNorms; with use_parallel_residual,
    x + attn(ln(x)) + mlp(ln(x)) off one input_layernorm (no post-attention norm)."""

    attention_cls = StableLmAttention

    def __init__(self, cfg: StableLmConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.parallel = cfg.use_parallel_residual
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = (
            None if self.parallel else LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps))

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (block output, residual stream without it), as the Llama
        layer's; the parallel form sums attention and MLP off the same norm."""
        if not self.parallel:  # a config constant: one graph per model
            return super().forward(hidden, residual, rope)
        normed, residual = add_and_norm(self.input_layernorm, hidden, residual)
        return self.self_attn(normed, rope) + self.mlp(normed), residual


class StableLmModel(LlamaModel):
    """The Llama body over StableLM layers: a LayerNorm at the end, the rotary table of the
    rotary dims."""

    layer_cls = StableLmDecoderLayer

    def __init__(self, cfg: StableLmConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    @staticmethod
    def rotary_config(cfg: StableLmConfig) -> StableLmConfig:
        """The table of the rotary dims alone."""
        return dataclasses.replace(cfg, head_dim=cfg.rotary_dim)


class StableLmForCausalLM(LlamaForCausalLM):
    """StableLM for causal LM: the Llama contract over StableLmModel (tensor and pipeline
    parallelism and LoRA as Llama's); its per-head q/k norms load stacked, and tensor
    parallelism with them (whole [H, D] weights) is refused by name."""

    model_cls = StableLmModel
    config_cls = StableLmConfig
    # transformers' StableLmConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "silu", "layer_norm_eps": 1e-5, "max_position_embeddings": 4096,
                   "tie_word_embeddings": False}
    # transformers' StableLM never reads these: use_qkv_bias for q/k/v alone, no window
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("attention_bias", "qkv_bias", "o_proj_bias",
                                          "mlp_bias", "rms_norm_eps")

    @staticmethod
    def check_tensor_parallel(config: StableLmConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size where qk_layernorm's per-head weights would
        have to follow each rank's heads (they are not sharded)."""
        if config.qk_layernorm:
            raise ValueError(f"tensor_parallel_size {world}: StableLmForCausalLM with "
                             "qk_layernorm is not sharded yet (run it with 1)")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | ExpertWeight | None:
        """Our parameter name for a checkpoint tensor name; a head's q/k LayerNorm weight
        fills its row of the stacked [H, D] parameter."""
        match = _HEAD_NORM.match(hf_name)
        if match:
            return ExpertWeight(f"{match['norm']}.weight", int(match["head"]))
        return super().weight_name(hf_name)
