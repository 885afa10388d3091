"""Gemma 3n's text decoder equal to transformers on checkpoints with random norms and AltUp
coefficients (AltUp off its 0th stream, Laurel, PLE, KV-shared layers, activation sparsity), its
image-audio-text checkpoint served text-only (vision / audio ids on their own embedders, the
towers skipped), and what it refuses by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.utils import assert_matches_transformers, edited_checkpoint, engine_config


def _random_norms_and_coefs(key: str, value: torch.Tensor, gen: torch.Generator):
    """transformers saves ones (norms) and zeros (AltUp's coefficients, its output scale); drawn
    away from those so a misplaced one shows."""
    if "norm" in key or key.endswith(("correct_output_scale", "correction_coefs.weight",
                                      "prediction_coefs.weight")):
        return value + 0.3 * torch.randn(value.shape, generator=gen)
    return None


@pytest.fixture
def stub_vision_tower(monkeypatch):
    """Gemma 3n's vision tower is timm's (not installed): an empty module in its place, which
    text-only inputs never reach."""
    from transformers.models.gemma3n import modeling_gemma3n

    auto = modeling_gemma3n.AutoModel

    class Stub:
        @staticmethod
        def from_config(config, **kwargs):
            if config.model_type == "gemma3n_vision":
                return nn.Module()
            return auto.from_config(config, **kwargs)

    monkeypatch.setattr(modeling_gemma3n, "AutoModel", Stub)


def test_random_norms_and_coefficients_match_transformers():
    ckpt = edited_checkpoint("gemma3n", _random_norms_and_coefs)
    assert_matches_transformers(ckpt, new_tokens=8, hi=24)


def test_image_audio_text_checkpoint_text_only_matches_transformers(stub_vision_tower):
    """Prompts over the whole vocabulary: ids from 256 take the vision / audio embedders and
    per-layer row 0; the audio tower's tensors and a vision tower's are skipped."""
    tower = ("model.vision_tower.timm_model.conv_stem.conv.weight", torch.ones(8, 3, 3, 3))
    ckpt = edited_checkpoint("gemma3n_vl", _random_norms_and_coefs, extra=(tower,))
    assert_matches_transformers(ckpt, new_tokens=8, hi=24)
    audio = {"vocab_offset": 320, "vocab_size": 32}  # ids past the audio table: refused
    with pytest.raises(ValueError, match="vocab_offset"):
        engine_config("gemma3n_vl", hard_token_embedders={"embed_vision": {
            "vocab_offset": 256, "vocab_size": 64}, "embed_audio": audio})


def test_config_and_refusals():
    cfg = engine_config("gemma3n")
    assert [cfg.kv_source(i) for i in range(4)] == [0, 1, 0, 1]
    assert cfg.intermediate_sizes == (128, 96, 128, 64)
    assert cfg.sparsity_std_multipliers[2] is None
    assert cfg.sparsity_std_multipliers[0] == pytest.approx(1.6448536)
    assert (cfg.altup_num_inputs, cfg.altup_active_idx, cfg.hard_token_embedders) == (4, 1, ())
    with pytest.raises(ValueError, match="altup_active_idx"):
        engine_config("gemma3n", altup_active_idx=4)
    with pytest.raises(ValueError, match="activation_sparsity_pattern"):
        engine_config("gemma3n", activation_sparsity_pattern=[0.5, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="intermediate_size"):
        engine_config("gemma3n", intermediate_size=[64, 64])
    with pytest.raises(ValueError, match="num_kv_shared_layers"):
        engine_config("gemma3n", num_kv_shared_layers=4)
