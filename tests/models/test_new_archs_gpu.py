"""The architectures after Llama/Qwen on CUDA (GPU only): compiled with CUDA graphs and the
Triton attention kernels (head_dim 16 and 256, Gemma 2's soft-capped scores, sliding and full
layers, partial rotary, Granite's scalars, SmolLM3's NoPE layers, OLMo 2's post-norms, OPT's
and GPT-2's learned positions, LayerNorms and ungated MLPs, GPT-NeoX's [H, 3, D] fused qkv and
serial or parallel residuals, Phi's q/k LayerNorms, StableLM's per-head ones, GPTBigCode's
one KV head, Cohere's and GPT-J's interleaved RoPE, GraniteMoe's experts, GPT-OSS's sinks and
biased clamped-SwiGLU experts, grouped sigmoid routers, ALiBi: Bloom, MPT, Falcon-RW; Gemma 4's
shared-KV layers and 512-wide heads, GPT-Neo's unscaled windows, image-text-to-text checkpoints'
text stacks), each gives transformers' greedy tokens, in float32."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from tests.utils import edited_checkpoint, hf_greedy, random_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _drawn_router(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """A router weight transformers left at zeros (5.17 does for ERNIE 4.5 MoE) drawn: with
    every expert's score equal, top-k ties break one way on the CPU, another on CUDA."""
    if key.endswith(("mlp.gate.weight", "mlp.router.gate.weight")) and not value.any():
        return torch.randn(value.shape, generator=gen) * 0.1
    return None


@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma2_d256", "gemma3", "gemma3_d256",
                                  "phi3", "phi3_longrope_partial", "granite", "smollm3",
                                  "olmo2", "opt", "opt_350m_layout", "gpt2", "gpt2_options",
                                  "gpt_neox", "gpt_neox_serial", "phi",
                                  "starcoder2", "stablelm", "stablelm_serial", "gpt_bigcode",
                                  "gpt_bigcode_mha", "cohere", "cohere_plain", "gptj",
                                  "granitemoe", "falcon", "falcon_new_arch",
                                  "falcon_serial", "glm", "glm4", "olmo", "olmo3",
                                  "olmoe", "gpt_oss", "ministral", "seed_oss", "helium",
                                  "arcee", "ernie4_5", "cohere2", "exaone4", "hunyuan",
                                  "glm4_moe", "dots1", "granitemoeshared", "ernie4_5_moe",
                                  "deepseek_v2", "deepseek_v3", "bloom", "bloom_post_ln", "mpt",
                                  "falcon_alibi", "flex_olmo", "dbrx", "phimoe",
                                  "hunyuan_v1_moe", "minimax_m2", "nemotron", "persimmon",
                                  "vaultgemma", "apertus", "ministral3", "cwm", "jais2",
                                  "glm4_moe_lite", "minicpm3", "exaone_moe",
                                  "deepseek_v32", "glm_moe_dsa", "axk1", "axk2", "bitnet",
                                  "gemma4", "gemma4_moe", "gemma4_d512", "gemma3n", "gpt_neo",
                                  "codegen",
                                  "nanochat", "cohere2_moe", "cohere2_moe_sigmoid",
                                  "solar_open", "youtu", "mellum", "afmoe",
                                  "mimo_v2_flash", "longcat_flash", "hyperclovax",
                                  "hyperclovax_plain", "hy_v3", "granite_swa", "llama4",
                                  "aria_text", "aria_text_options", "emu3",
                                  "laguna", "granitemoe_swa", "hrm_text",
                                  # image-text-to-text checkpoints' text stacks
                                  "gemma3_vl", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
                                  "qwen3_vl_moe", "mistral3", "llava", "gemma4_vl",
                                  # (aria_vl is CPU-only: transformers 5.17 cannot build an
                                  # AriaConfig from a dict vision_config; its text is aria_text)
                                  "llama4_vl", "emu3_vl",
                                  "diffllama", "jetmoe",
                                  # (transformers 5.17 permutes the default M-RoPE's
                                  # frequencies on text: a linear-rope Compass agrees)
                                  "cohere_compass_linear"])
def test_compiled_with_cuda_graphs_matches_transformers(name, tmp_path):
    ckpt = edited_checkpoint(name, _drawn_router)
    # within 32 positions: LongRoPE's original length (transformers recomputes past it)
    prompts = random_prompts(5, 300, lo=3, hi=16, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    # a tenth of the device: GPU runs take these cases in parallel processes
    llm = LLM(str(ckpt), dtype="float32", gpu_memory_utilization=0.1, max_num_seqs=8,
              compile_cache_dir=str(tmp_path))
    for k in (1, 5):  # decode batches of 1 and 5 sequences
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:k]], params,
                            use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts[:k], 12)
    llm.shutdown()


@pytest.mark.parametrize("name", ["phi3_longrope_partial", "llama_longrope"])
def test_longrope_prompts_past_the_original_length_on_cuda(name, tmp_path):
    """Prompts longer than LongRoPE's original length (32) read the long-factor rows from
    their first token under CUDA graphs, batched with shorter ones: transformers' tokens."""
    ckpt = edited_checkpoint(name, _drawn_router)
    prompts = [*random_prompts(2, 300, lo=40, hi=60, seed=7),
               *random_prompts(2, 300, lo=20, hi=30, seed=8)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(ckpt), dtype="float32", gpu_memory_utilization=0.1, max_num_seqs=8,
              max_model_len=128, compile_cache_dir=str(tmp_path))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    expected = [hf_greedy(ckpt, [p], 12)[0] for p in prompts]
    if name.startswith("phi3") and not _hf_recomputes_phi3_whole():
        # older transformers feed Phi-3's recompute step its last token alone: the prompts
        # that cross the original length take the CPU engine's tokens, which equal newer
        # transformers' (tests/models/test_config_options.py)
        with LLM(str(ckpt), device="cpu", enforce_eager=True, dtype="float32",
                 max_model_len=128) as cpu:
            expected[2:] = [o.outputs[0].token_ids for o in cpu.generate(
                [{"prompt_token_ids": p} for p in prompts[2:]], params, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()


def _hf_recomputes_phi3_whole() -> bool:
    """Whether the installed transformers' Phi-3, where it drops its cache at the original
    length, recomputes the whole sequence (the releases that reset next_sequence_length)."""
    import inspect

    import transformers

    source = inspect.getsource(transformers.Phi3ForCausalLM.prepare_inputs_for_generation)
    return "next_sequence_length" in source
