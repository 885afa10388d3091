"""Cohere, GPT-J and GraniteMoe beyond the transformers sweep: the interleaved RoPE helper
against transformers' rotate_every_two, options and parallelism refused by name, and
GraniteMoe's transformers-5 weight names."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary_interleaved
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import make_checkpoint


def test_interleaved_rotary_equals_transformers_rotate_every_two():
    from transformers.models.gptj.modeling_gptj import (
        apply_rotary_pos_emb,
        create_sinusoidal_positions,
    )

    _, cfg = build_model_config(load_hf_config(make_checkpoint("cohere")))
    cfg = dataclasses.replace(cfg, rope_theta=10000.0)  # GPT-J's base
    q = torch.randn(5, 4, cfg.head_dim)  # [T, H, D]
    got, _ = apply_rotary_interleaved(q, q, RotaryEmbedding(cfg, 64)(torch.arange(5)))
    sin, cos = create_sinusoidal_positions(64, cfg.head_dim)[None, :5].chunk(2, dim=-1)
    want = apply_rotary_pos_emb(q[None], sin, cos)[0]  # [1, T, H, D] -> [T, H, D]
    torch.testing.assert_close(got, want)


def test_gptj_pipeline_parallelism_and_options_are_refused_by_name():
    from compiled_llm.distributed.pipeline_parallel import check_pipeline

    hf = load_hf_config(make_checkpoint("gptj"))
    model_cls, cfg = build_model_config(hf)
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: GPTJForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
    for rotary_dim in (None, 7, 32):  # null: HF's table is as wide as the hidden size
        with pytest.raises(ValueError, match=f"rotary_dim {rotary_dim!r} is not supported"):
            build_model_config({**hf, "rotary_dim": rotary_dim})
    cohere = load_hf_config(make_checkpoint("cohere"))
    with pytest.raises(ValueError, match="logit_scale must be a number"):
        build_model_config({**cohere, "logit_scale": None})


def test_granitemoe_reads_transformers_5_weight_names():
    model_cls, _ = build_model_config(load_hf_config(make_checkpoint("granitemoe")))
    prefix = "model.layers.0"
    for theirs, ours in (("block_sparse_moe.input_linear.weight", "mlp.experts.w13_weight"),
                         ("block_sparse_moe.experts.gate_up_proj", "mlp.experts.w13_weight"),
                         ("block_sparse_moe.output_linear.weight", "mlp.experts.w2_weight"),
                         ("block_sparse_moe.experts.down_proj", "mlp.experts.w2_weight"),
                         ("block_sparse_moe.router.layer.weight", "mlp.gate.weight"),
                         ("block_sparse_moe.router.weight", "mlp.gate.weight")):
        assert model_cls.weight_name(f"{prefix}.{theirs}") == f"{prefix}.{ours}"
