"""Checkpoint variants with LLM's defaults against transformers: a float16 checkpoint runs in
float32 on CPU (within float16's rounding of transformers', not bfloat16's), CUDA's auto
attention backend at head dims the Triton kernels do not take, and hand-written config.json
files read with the keys they leave out as transformers fills them."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.worker.loader import load_hf_config, resolve_dtype
from tests.utils import hf_greedy, make_checkpoint, random_prompts

NEW_TOKENS = 12


def test_float16_checkpoint_runs_in_float32_on_cpu():
    ckpt = make_checkpoint("llama", "float16")
    assert resolve_dtype("auto", load_hf_config(ckpt), torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", load_hf_config(ckpt), torch.device("cuda")) == torch.float16


def test_float16_checkpoint_matches_transformers_with_default_dtype():
    import transformers

    ckpt = make_checkpoint("llama", "float16")
    llm = LLM(str(ckpt), enforce_eager=True)  # dtype left at "auto"
    prompts = random_prompts(4, llm.engine.model_config.vocab_size, lo=10, hi=40, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert hf.dtype == torch.float16  # transformers' own default for this checkpoint
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        expected = ref[torch.arange(len(p) - 1), torch.tensor(p[1:])]
        got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], p[1:])])
        # bfloat16 weights and activations land ~1e-2 off; float16 ones within ~2e-3
        torch.testing.assert_close(got, expected, atol=5e-3, rtol=0)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts, NEW_TOKENS)


@pytest.mark.parametrize("head_dim,backend", [(128, "triton"), (16, "triton"), (24, "torch"),
                                              (80, "torch"), (8, "torch")])
def test_auto_attention_backend_falls_back_at_head_dims_triton_does_not_take(head_dim, backend):
    from compiled_llm.config import EngineArgs

    args = EngineArgs(model="unused")
    assert args.attention_backend_for("cuda", head_dim) == backend
    assert args.attention_backend_for("cpu", head_dim) == "torch"
    if backend == "torch":
        with pytest.raises(ValueError, match="attention_backend=\"triton\" needs a head_dim"):
            EngineArgs(model="unused", attention_backend="triton").attention_backend_for(
                "cuda", head_dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_head_dim_24_matches_transformers_on_cuda():
    """On CUDA, LLM's defaults (the torch attention backend that auto picks for head_dim 24,
    piecewise CUDA graphs only) give transformers' greedy tokens."""
    ckpt = make_checkpoint("llama_hd24")
    llm = LLM(str(ckpt), engine_core_process=False)  # in process: the runner is inspected
    runner = llm.engine.executor.worker.runner
    assert runner.attn_backend == "torch" and runner.full_graph is None
    assert runner.dispatcher.piecewise_sizes and not runner.dispatcher.full_sizes
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, lo=5, hi=40, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts, NEW_TOKENS)


# hand-written config.json files that leave out what each transformers class fills in:
# Qwen3's num_key_value_heads (32) and head_dim (128), Mixtral's experts (8, top-2)
WRITTEN = {
    "qwen3": ("Qwen3ForCausalLM", {"num_attention_heads": 32, "rope_theta": 1e6}),
    "mixtral": ("MixtralForCausalLM", {"num_attention_heads": 8}),
}


@pytest.mark.parametrize("model_type", sorted(WRITTEN))
def test_hand_written_config_reads_as_transformers_fills_it(model_type, tmp_path):
    import json

    import transformers

    arch, extra = WRITTEN[model_type]
    written = {"architectures": [arch], "model_type": model_type, "hidden_size": 64,
               "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 320, **extra}
    (tmp_path / "config.json").write_text(json.dumps(written))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(tmp_path))
    model.save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "config.json").write_text(json.dumps(written))  # as written, not as saved
    filled = load_hf_config(tmp_path)
    assert filled["max_position_embeddings"] > 2048 and "model_type" in filled
    llm = LLM(str(tmp_path), enforce_eager=True, skip_tokenizer_init=True)
    prompts = random_prompts(2, 320, lo=5, hi=20, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(tmp_path, prompts, 6)
