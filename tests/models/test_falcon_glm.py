"""Falcon and GLM beyond the transformers sweep: GLM's interleaved partial RoPE against
transformers', Falcon-40B's one-LayerNorm layout, and the options, parallelism and LoRA each
refuses by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.models.rotary import (
    RotaryEmbedding,
    apply_partial_rotary,
    apply_rotary_interleaved,
)
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import hf_greedy, make_checkpoint, random_prompts


def test_glm_partial_interleaved_rotary_equals_transformers():
    import dataclasses

    from transformers.models.glm.modeling_glm import apply_rotary_pos_emb

    _, cfg = build_model_config(load_hf_config(make_checkpoint("glm")))
    assert cfg.rotary_dim == cfg.head_dim // 2
    rope = RotaryEmbedding(dataclasses.replace(cfg, head_dim=cfg.rotary_dim), 64)
    cos, sin = rope(torch.arange(5))  # [T, 1, rotary_dim]
    q = torch.randn(5, 4, cfg.head_dim)  # [T, H, D]
    got, _ = apply_partial_rotary(q, q, (cos, sin), cfg.rotary_dim, apply_rotary_interleaved)
    # transformers': [B, H, T, D] heads, [B, T, rotary_dim] tables
    want, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None],
                                   cos.transpose(0, 1), sin.transpose(0, 1))
    torch.testing.assert_close(got, want[0].transpose(0, 1))


def test_falcon_new_architecture_with_one_layernorm_matches_transformers():
    ckpt = make_checkpoint("falcon_new_arch_one_ln")
    prompts = random_prompts(3, 300, lo=3, hi=20, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llm = LLM(str(ckpt), dtype="float32", enforce_eager=True, engine_core_process=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts, 6)
    llm.shutdown()


@pytest.mark.parametrize(("key", "value", "match"), [
    ("parallel_attn", False, "parallel_attn=False is not supported with new_decoder"),
    ("num_ln_in_parallel_attn", 3, "num_ln_in_parallel_attn 3 is not supported"),
    ("num_kv_heads", 3, "num_kv_heads 3 must divide"),
])
def test_falcon_options_it_cannot_follow_are_refused_by_name(key, value, match):
    hf = load_hf_config(make_checkpoint("falcon_new_arch"))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, key: value})


def test_falcon_layouts_transformers_cannot_run_are_refused_by_name():
    hf = load_hf_config(make_checkpoint("falcon_serial"))
    with pytest.raises(ValueError, match="num_kv_heads 2 is not supported without"):
        build_model_config({**hf, "num_kv_heads": 2})
    with pytest.raises(ValueError, match="num_ln_in_parallel_attn=2 is not supported"):
        build_model_config({**hf, "parallel_attn": True, "num_ln_in_parallel_attn": 2})


def test_falcon_parallelism_and_lora_are_refused_by_name():
    from compiled_llm.distributed.pipeline_parallel import check_pipeline

    ckpt = make_checkpoint("falcon")
    model_cls, cfg = build_model_config(load_hf_config(ckpt))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: FalconForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
    for name, arch in (("falcon", "FalconForCausalLM"), ("glm", "GlmForCausalLM")):
        with pytest.raises(ValueError, match=f"enable_lora: {arch} has no module"):
            LLM(str(make_checkpoint(name)), enable_lora=True, enforce_eager=True)


def test_glm_without_num_key_value_heads_takes_transformers_default_of_two():
    """A config.json that leaves num_key_value_heads out: GlmConfig's default (2), as
    transformers reads it, not one KV head per query head."""
    hf = load_hf_config(make_checkpoint("glm"))
    hf.pop("num_key_value_heads")
    _, cfg = build_model_config(hf)
    assert cfg.num_key_value_heads == 2 and cfg.num_attention_heads == 4


def test_falcon_older_key_spellings_read_as_transformers_reads_them():
    """n_head / n_layer / n_head_kv (FalconConfig's attribute_map) name the same keys."""
    hf = load_hf_config(make_checkpoint("falcon_new_arch"))
    old = {key: value for key, value in hf.items()
           if key not in ("num_attention_heads", "num_hidden_layers", "num_kv_heads")}
    old.update(n_head=hf["num_attention_heads"], n_layer=hf["num_hidden_layers"],
               n_head_kv=hf["num_kv_heads"])
    assert build_model_config(old)[1] == build_model_config(hf)[1]
