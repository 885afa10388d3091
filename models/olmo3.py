"""OLMo 3 decoder (Olmo3ForCausalLM): OLMo 2's post-norm layer with a sliding window on the
layers layer_types marks sliding (by default three of every four), which turn on their own
default RoPE table (transformers' sliding_attention rope parameters: its base 500000 unless
config.json gives them; the full layers' rope_theta and rope_scaling are the others')."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.gemma3 import FULL, SLIDING, split_layer_rope
from compiled_llm.models.olmo2 import Olmo2ForCausalLM, Olmo2Model
from compiled_llm.models.rotary import local_rotary_embedding

DEFAULT_THETA = 500000.0  # transformers' Olmo3Config.default_theta


@dataclasses.dataclass
class Olmo3Config(DecoderConfig):
    """DecoderConfig plus the sliding layers' RoPE base (their rope is the default one)."""

    local_rope_theta: float = DEFAULT_THETA

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Olmo3Config:
        """transformers' Olmo3Config keys: rope_parameters per layer type (5.x) or a legacy
        rope_theta / rope_scaling for the full layers alone; layer_types (default: every
        fourth layer full, the others sliding)."""
        hf = dict(hf_config)
        hf.pop("rope_local_base_freq", None)  # not Olmo 3's
        local_theta = split_layer_rope(hf, {"rope_local_base_freq": DEFAULT_THETA})
        if not hf.get("layer_types"):
            hf["layer_types"] = [FULL if (i + 1) % 4 == 0 else SLIDING
                                 for i in range(hf["num_hidden_layers"])]
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, local_rope_theta=float(local_theta))


class Olmo3Model(Olmo2Model):
    """Olmo2Model with the sliding layers on their own rotary table."""

    def __init__(self, cfg: Olmo3Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.local_rotary_emb = local_rotary_embedding(cfg, max_len)
        self.sliding = [i in cfg.sliding_window_layers for i in range(cfg.num_hidden_layers)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        ropes = {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}
        for layer, sliding in zip(self.layers, self.sliding, strict=True):
            hidden = layer(hidden, ropes[sliding])  # (cos, sin) [T, 1, D]
        return self.norm(hidden)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3 for causal LM: the Llama contract over Olmo3Model. Tensor parallelism as OLMo 2's
    (its q/k norms over the whole projection average their mean square over the ranks);
    pipeline parallelism refused by name (its body is not LlamaModel's layer loop)."""

    model_cls = Olmo3Model
    config_cls = Olmo3Config
    hf_defaults = {"rms_norm_eps": 1e-5, "rope_theta": DEFAULT_THETA, "sliding_window": 4096}
    # transformers' Olmo3 reads layer_types and sliding_window alone of the window keys, no
    # experts, o_proj biased as q/k/v, the MLP never biased
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "qkv_bias",
                            "o_proj_bias", "mlp_bias")
