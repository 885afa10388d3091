"""StarCoder2, StableLM and GPTBigCode beyond the transformers sweep's configs: every norm weight
random (per-head q/k LayerNorms each their own), their other config spellings (StarCoder2
without biases or a window, StableLM's default quarter of each head turned), LoRA on StableLM;
and what is refused by name (tensor parallelism where the layers are not sharded, pipeline
parallelism where the body is not Llama's loop, LoRA where there is no gate/up/down_proj)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.lora.helpers import make_adapter, merged_greedy
from tests.models.test_config_options import assert_matches_transformers
from tests.utils import make_checkpoint, random_prompts

NORMS = ("layernorm.", "norm.", "ln_1.", "ln_2.", "ln_f.", "_layernorm.norms.")


def _random_norms(name: str, dest):
    """A copy of checkpoint `name` whose every LayerNorm weight and bias (1 and 0 as
    transformers initialises them) is moved by random amounts."""
    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    tensors = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(3)
    for key, value in tensors.items():
        if any(part in key for part in NORMS):
            tensors[key] = value + 0.3 * torch.randn(value.shape, generator=gen)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("name", ["starcoder2", "stablelm", "gpt_bigcode_mha"])
def test_random_norms_match_transformers(name, tmp_path):
    """Each LayerNorm (StableLM's per-head ones stacked per head) read where it belongs."""
    ckpt = _random_norms(name, tmp_path)
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=5, hi=40, seed=8))


def test_starcoder2_without_biases_or_window_matches_transformers():
    ckpt = make_checkpoint("starcoder2_options")
    _, cfg = build_model_config(load_hf_config(ckpt))
    assert (cfg.attention_bias, cfg.mlp_bias, cfg.sliding_window) == (False, False, -1)
    assert not cfg.tie_word_embeddings
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=5, hi=40, seed=9))


def test_stablelm_default_rotary_factor_and_refused_head_dim():
    """No partial_rotary_factor anywhere: a quarter of each head turns, as transformers'."""
    hf = load_hf_config(make_checkpoint("stablelm_serial"))
    bare = {key: value for key, value in hf.items() if key != "partial_rotary_factor"}
    bare["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    assert build_model_config(bare)[1].rotary_dim == 4  # a quarter of head_dim 16
    with pytest.raises(ValueError, match="head_dim 32 is not supported for StableLM"):
        build_model_config({**hf, "head_dim": 32})


def test_gpt_bigcode_options_refused_by_name():
    hf = load_hf_config(make_checkpoint("gpt_bigcode"))
    _, cfg = build_model_config(hf)
    assert (cfg.multi_query, cfg.num_key_value_heads) == (True, 1)
    with pytest.raises(ValueError, match="add_cross_attention=True is not supported for "
                                         "GPTBigCodeForCausalLM"):
        build_model_config({**hf, "add_cross_attention": True})


@pytest.mark.parametrize("name", ["stablelm_serial", "stablelm"])
def test_stablelm_lora_matches_peft_merged(name):
    base = make_checkpoint(name)
    adapter = make_adapter(base, 1, rank=4)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14], [40, 41, 42]]
    with LLM(str(base), enable_lora=True, max_lora_rank=4, dtype="float32",
             enforce_eager=True) as llm:
        from compiled_llm import LoRARequest, SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                            lora_request=LoRARequest("a", 1, str(adapter)))
        got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == merged_greedy(base, adapter, prompts, 6)


@pytest.mark.parametrize(("name", "arch"), [("stablelm", "StableLmForCausalLM")])
def test_tensor_parallelism_refused_by_name(name, arch):
    with pytest.raises(ValueError, match=f"tensor_parallel_size 2: {arch}"):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=2)


@pytest.mark.parametrize(("name", "arch"), [("starcoder2", "Starcoder2ForCausalLM"),
                                            ("gpt_bigcode", "GPTBigCodeForCausalLM")])
def test_lora_refused_by_the_module_it_lacks(name, arch):
    with pytest.raises(ValueError, match=f"enable_lora: {arch} has no module"):
        LLM(str(make_checkpoint(name)), enable_lora=True, enforce_eager=True)


def test_pipeline_parallelism_refused_for_gpt_bigcode_only():
    for name in ("starcoder2", "stablelm"):  # the Llama body's layer loop
        check_pipeline(*build_model_config(load_hf_config(make_checkpoint(name))), 2)
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("gpt_bigcode")))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: GPTBigCodeForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
