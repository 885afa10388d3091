"""DecoderConfig: the fields a decoder-only model reads from an HF config.json.

One dataclass for the whole family; each model file adjusts defaults through `from_hf`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _rope_params(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict) from either the older rope_scaling or newer rope_parameters."""
    params = dict(hf_config.get("rope_parameters") or {})
    scaling = dict(hf_config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", hf_config.get("rope_theta", 10000.0))
    merged = {**params, **scaling}
    kind = merged.get("rope_type", merged.get("type", "default"))
    merged["rope_type"] = kind
    return float(theta), merged


@dataclass
class DecoderConfig:
    """Shapes and constants of a Llama-family decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int = -1  # -1: full attention
    architecture: str = ""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """Read an HF config dict; `defaults` fill keys the architecture leaves out."""
        def get(key: str, fallback: Any = None) -> Any:
            return hf_config.get(key, defaults.get(key, fallback))

        heads = hf_config["num_attention_heads"]
        theta, scaling = _rope_params(hf_config)
        window = get("sliding_window") if get("use_sliding_window", True) else None
        return cls(
            vocab_size=hf_config["vocab_size"],
            hidden_size=hf_config["hidden_size"],
            intermediate_size=hf_config["intermediate_size"],
            num_hidden_layers=hf_config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf_config.get("num_key_value_heads") or heads,
            head_dim=hf_config.get("head_dim") or hf_config["hidden_size"] // heads,
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=get("max_position_embeddings", 2048),
            tie_word_embeddings=get("tie_word_embeddings", False),
            attention_bias=get("attention_bias", False),
            sliding_window=window or -1,
            architecture=(hf_config.get("architectures") or [""])[0],
        )
