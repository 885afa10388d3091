"""Gemma3nConfig: transformers' Gemma3nTextConfig read onto Gemma 4's config (one head shape on
every layer, KV sharing, per-layer inputs) plus Gemma 3n's own keys: AltUp's streams, Laurel's
rank, per-layer MLP widths and activation sparsity; what the engine cannot follow is refused by
name."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.gemma3 import FULL, SLIDING, split_layer_rope
from compiled_llm.models.gemma4_config import Gemma4Config, check_kv_sharing

DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "default", "rope_theta": 1_000_000.0}}


@dataclasses.dataclass
class Gemma3nConfig(Gemma4Config):
    """Gemma4Config (global head shape = the sliding layers') plus AltUp, Laurel, per-layer
    intermediate sizes and activation-sparsity cutoffs (standard deviations, 0: none)."""

    altup_num_inputs: int = 4
    altup_active_idx: int = 0
    altup_correct_scale: bool = True
    laurel_rank: int = 64
    intermediate_sizes: tuple[int, ...] = ()
    sparsity_std_multipliers: tuple[float | None, ...] = ()  # None: no sparsity on the layer
    # the image-audio-text checkpoint's embedders of its vision / audio token ids (served
    # text-only): (name, vocab_offset, vocab_size, hidden_size, rms_norm_eps)
    hard_token_embedders: tuple[tuple[str, int, int, int, float], ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Gemma3nConfig:
        """Gemma3nTextConfig's keys: layer_types (every 5th full by default), per-type
        rope_parameters, intermediate_size and activation_sparsity_pattern per layer."""
        hf = {**defaults, **hf_config}
        num_layers = hf["num_hidden_layers"]
        types = list(hf.get("layer_types") or [FULL if (i + 1) % 5 == 0 else SLIDING
                                               for i in range(num_layers)])
        hf["layer_types"] = types
        rope = hf.get("rope_parameters")
        if rope:  # 5.x's per-type dicts; 4.x's rope_theta / rope_local_base_freq read as such
            hf["rope_parameters"] = {kind: {**DEFAULT_ROPE[kind], **(rope.get(kind) or {})}
                                     for kind in (SLIDING, FULL)}
        local_theta = split_layer_rope(hf, defaults)
        hf["hidden_act"] = hf.get("hidden_activation") or "gelu_pytorch_tanh"
        sizes = per_layer(hf, "intermediate_size", num_layers, None)
        sparsity = per_layer(hf, "activation_sparsity_pattern", num_layers,
                             [0.95] * 10 + [0.0] * (num_layers - 10) if num_layers > 10 else
                             [0.0] * num_layers)
        hf["intermediate_size"] = max(sizes)
        base = super(Gemma4Config, cls).from_hf(hf, **defaults)
        shared = hf.get("num_kv_shared_layers", 15) or 0
        check_kv_sharing(types, shared)
        streams, active = hf.get("altup_num_inputs", 4), hf.get("altup_active_idx", 0)
        if not 0 <= active < streams:
            raise ValueError(f"altup_active_idx {active} is not supported: it must be below "
                             f"altup_num_inputs {streams}")
        return dataclasses.replace(
            base, local_rope_theta=float(local_theta), global_head_dim=base.head_dim,
            global_kv_heads=base.num_key_value_heads,
            final_logit_softcapping=hf.get("final_logit_softcapping"),
            num_kv_shared_layers=shared, hidden_size_per_layer_input=hf.get(
                "hidden_size_per_layer_input", 256),
            vocab_size_per_layer_input=hf.get("vocab_size_per_layer_input", 262_144),
            altup_num_inputs=streams, altup_active_idx=active,
            altup_correct_scale=bool(hf.get("altup_correct_scale", True)),
            laurel_rank=hf.get("laurel_rank", 64), intermediate_sizes=tuple(sizes),
            sparsity_std_multipliers=tuple(std_multiplier(p) for p in sparsity),
            hard_token_embedders=hard_token_embedders(hf, base.vocab_size))


def per_layer(hf: dict[str, Any], key: str, num_layers: int, default: list | None) -> list:
    """hf[key] as one value per layer (a single value repeated, as transformers does)."""
    value = hf.get(key)
    if value is None:
        value = default
    values = list(value) if isinstance(value, list | tuple) else [value] * num_layers
    if len(values) != num_layers:
        raise ValueError(f"{key} needs one value per layer ({num_layers}), got {len(values)}")
    return values


def std_multiplier(sparsity: float) -> float | None:
    """The gaussian top-k cutoff in standard deviations above the mean: the standard normal's
    inverse CDF at the target sparsity, in float32 as transformers computes it."""
    if not sparsity or sparsity <= 0.0:
        return None
    if sparsity >= 1.0:
        raise ValueError(f"activation_sparsity_pattern value {sparsity} is not supported "
                         "(below 1 only)")
    normal = torch.distributions.Normal(0.0, 1.0)
    return float(normal.icdf(torch.tensor(sparsity, dtype=torch.float32)))


def hard_token_embedders(hf: dict, vocab_size: int) -> tuple:
    """Gemma3nForConditionalGeneration's embed_vision / embed_audio (multimodal.py hands their
    sub-configs on): the vision ids must run up to the audio ones, the audio ids to the end of
    the vocabulary, as transformers' masks take them."""
    configs = hf.get("hard_token_embedders")
    if not configs:
        return ()
    out = tuple((name, cfg.get("vocab_offset", offset), cfg.get("vocab_size", 128),
                 cfg.get("hidden_size", hidden), cfg.get("rms_norm_eps", 1e-6))
                for (name, offset, hidden) in (("embed_vision", 262_144, 2048),
                                               ("embed_audio", 262_272, 1536))
                for cfg in [configs.get(name) or {}])
    (_, v_off, v_size, _, _), (_, a_off, a_size, _, _) = out
    if v_off + v_size != a_off or a_off + a_size < vocab_size:
        raise ValueError(f"vision_config / audio_config vocab_offset {v_off}, {a_off} and "
                         f"vocab_size {v_size}, {a_size} are not supported: the vision ids must "
                         f"run up to the audio ones, these to vocab_size {vocab_size}")
    return out
