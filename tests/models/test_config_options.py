"""config.json options read as transformers reads them: rope types (LongRoPE, proportional),
rope parameters standardized as transformers 5 does (a legacy rope_scaling, a top-level original
length, Mixtral's default theta), gate activations, and keys an architecture's transformers
class never reads. Greedy tokens and prompt logprobs equal transformers'; what the engine cannot
follow is refused by name."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import model_len_bounds
from compiled_llm.models import DecoderConfig
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import hf_greedy, make_checkpoint, random_prompts

NEW_TOKENS = 8
BASE = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "max_position_embeddings": 512}


def _edited(name: str, dest, edit):
    """A copy of checkpoint `name` whose config.json `edit(config)` changes in place."""
    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def assert_matches_transformers(ckpt, prompts, new_tokens: int = NEW_TOKENS, **llm_kwargs):
    """Greedy tokens equal transformers' generate; prompt logprobs its forward's, in float32."""
    import transformers

    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32", **llm_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True,
                            prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts, new_tokens)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        expected = ref[torch.arange(len(p) - 1), torch.tensor(p[1:])]
        got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], p[1:])])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert llm.engine.num_used_blocks == 0


def _drop_rope_theta(cfg: dict) -> None:  # an older Mixtral config.json: HF's theta is 1e6
    cfg["rope_parameters"].pop("rope_theta")


def _top_level_original(cfg: dict) -> None:  # Phi-3's spelling, which transformers prefers
    cfg["original_max_position_embeddings"] = 16


EDITS = {"mixtral": _drop_rope_theta, "llama3_rope": _top_level_original}
CASES = ["llama_proportional_rope", "llama_gelu", "qwen3_gelu_tanh", "mistral_stray_keys",
         "qwen2_stray_keys", "mixtral_stray_keys", "qwen3_moe_stray_keys", *EDITS]


@pytest.mark.parametrize("name", CASES)
def test_matches_transformers(name, tmp_path):
    ckpt = _edited(name, tmp_path, EDITS[name]) if name in EDITS else make_checkpoint(name)
    # longer than mistral_stray_keys' window of 16, which its max_window_layers must not limit
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=20, hi=48, seed=2))


def test_longrope_matches_transformers_across_its_original_length():
    ckpt = make_checkpoint("llama_longrope")
    assert model_len_bounds(load_hf_config(ckpt)) == (512, 512)  # vLLM's default: the whole
    # prompts within the original length generating past it: HF's decode switches to
    # long_factor at position 32, as the table's rows do
    prompts = random_prompts(3, 300, lo=20, hi=32, seed=3)
    assert_matches_transformers(ckpt, prompts, new_tokens=12, max_model_len=128)
    # prompts longer than it: HF rotates the whole prompt (and what follows) with long_factor,
    # as the table's long rows do for such a request
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=33, hi=60, seed=4),
                                new_tokens=8, max_model_len=128)


def _greedy_logprobs(llm, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [step[t].logprob for step, t in zip(
        o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)]) for o in outs]


def test_longrope_prompts_either_side_of_the_original_length_share_no_blocks():
    """A prompt past the original length holds K/V of the long rows: a shorter prompt with
    the same leading tokens must not reuse its blocks, nor the reverse (prefix caching on),
    so each gives what an engine without a prefix cache gives."""
    ckpt = make_checkpoint("llama_longrope")
    long_prompt = random_prompts(1, 300, lo=48, hi=49, seed=6)[0]
    short_prompt = long_prompt[:30]
    kwargs = dict(max_model_len=128, enforce_eager=True, dtype="float32")
    plain = LLM(str(ckpt), enable_prefix_caching=False, **kwargs)
    expected = _greedy_logprobs(plain, [short_prompt, long_prompt])
    plain.shutdown()
    llm = LLM(str(ckpt), **kwargs)
    runs = [_greedy_logprobs(llm, [short_prompt])[0], _greedy_logprobs(llm, [long_prompt])[0],
            *_greedy_logprobs(llm, [long_prompt, short_prompt])[::-1]]
    for (tokens, logprobs), (want_tokens, want) in zip(runs, expected * 2, strict=True):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want, abs=1e-5)
    assert llm.engine.num_used_blocks == 0


def test_phi3_partial_rotary_longrope_matches_transformers():
    """Phi-4 mini's config shape: 3/4 of each head turned by LongRoPE, the rest passed; prompts
    within the original length, decoding past it (the sequence recomputed with long_factor
    there, as transformers' Phi-3 drops its cache), and longer than it (long_factor from
    their first token)."""
    ckpt = make_checkpoint("phi3_longrope_partial")
    assert model_len_bounds(load_hf_config(ckpt)) == (512, 512)
    prompts = random_prompts(4, 300, lo=8, hi=30, seed=3)
    assert_matches_transformers(ckpt, prompts, new_tokens=24, max_model_len=128)
    assert_matches_transformers(ckpt, random_prompts(2, 300, lo=40, hi=60, seed=5),
                                new_tokens=8, max_model_len=128)


def _gemma3_4x(cfg: dict) -> None:  # the config.json transformers 4.x wrote for Gemma 3
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.update(rope_theta=rope["full_attention"]["rope_theta"], sliding_window_pattern=2,
               rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
               rope_scaling={"rope_type": "linear", "factor": 2.0})


def test_gemma3_config_of_either_transformers_spelling(tmp_path):
    """Gemma 3's rope per layer type (5.x) or rope_theta, rope_local_base_freq and
    sliding_window_pattern (4.x): the same model, transformers' tokens and logprobs."""
    prompts = random_prompts(3, 300, lo=10, hi=40, seed=4)
    assert_matches_transformers(make_checkpoint("gemma3"), prompts)
    assert_matches_transformers(_edited("gemma3", tmp_path, _gemma3_4x), prompts)


def test_gemma3_max_position_embeddings_is_already_scaled():
    """4.x's Gemma 3 keys with linear scaling: the limit is max_position_embeddings (vLLM's)."""
    cfg = {**BASE, "model_type": "gemma3_text", "max_position_embeddings": 1024,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert model_len_bounds(cfg) == (1024, 1024)
    assert model_len_bounds({**cfg, "model_type": "llama"}) == (8192, 8192)


def test_phi3_older_rope_types_read_as_longrope():
    """transformers' Phi3Config reads "su" and "yarn" as LongRoPE."""
    phi3 = {**BASE, "architectures": ["Phi3ForCausalLM"], "original_max_position_embeddings": 32}
    for kind in ("su", "yarn"):
        rope = {"type": kind, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
        _, cfg = build_model_config({**phi3, "rope_scaling": rope})
        assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.rms_norm_eps == 1e-5


@pytest.mark.parametrize("extra,match", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                          "full_attention": {"rope_type": "default"}}}, "sliding_attention"),
])
def test_gemma3_options_it_cannot_follow_are_refused_by_name(extra, match):
    gemma = {**BASE, "architectures": ["Gemma3ForCausalLM"], "head_dim": 16}
    with pytest.raises(ValueError, match=match):
        build_model_config({**gemma, **extra})


@pytest.mark.parametrize("cls_name,extra", [
    ("LlamaConfig", {"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 3.0}}),
    ("LlamaConfig", {"rope_parameters": {  # a legacy rope_scaling replaces rope_parameters
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 8,
        "original_max_position_embeddings": 32},
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("LlamaConfig", {"original_max_position_embeddings": 16, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("LlamaConfig", {"partial_rotary_factor": 0.5, "rope_parameters": {
        "rope_type": "proportional", "rope_theta": 1e4}}),
    ("MixtralConfig", {}),  # its default theta
])
def test_rope_parameters_as_transformers_standardizes_them(cls_name, extra):
    import transformers

    hf_config = getattr(transformers, cls_name)(**BASE, **copy.deepcopy(extra))  # it edits them
    hf_config.standardize_rope_params()  # as each rope init function does, on the full config
    hf = hf_config.rope_parameters
    arch = cls_name.replace("Config", "ForCausalLM")
    cfg = build_model_config({**BASE, **extra, "architectures": [arch]})[1]
    assert cfg.rope_theta == hf["rope_theta"]
    assert cfg.rope_scaling == {key: value for key, value in hf.items() if key != "rope_theta"}


def test_stray_sliding_window_on_llama_is_refused():
    base = json.loads((make_checkpoint("llama") / "config.json").read_text())
    # transformers' Llama attends to every position in a forward pass, but generate's cache
    # (built from config.sliding_window) keeps only the last 8 tokens
    with pytest.raises(ValueError, match="sliding_window 8 is not supported for LlamaForCausal"):
        build_model_config({**base, "sliding_window": 8})
    assert build_model_config({**base, "sliding_window": 4096})[1].sliding_window == -1
    classifier = {**base, "architectures": ["LlamaForSequenceClassification"]}
    assert build_model_config({**classifier, "sliding_window": 8})[1].sliding_window == -1


@pytest.mark.parametrize("hf_config,match", [
    ({"partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "linear", "factor": 2.0}},
     r"partial_rotary_factor 0\.5 is not supported with rope_type 'linear'"),
    ({"rope_parameters": {"rope_type": "mrope"}}, r"rope_scaling\.rope_type 'mrope' is not sup"),
    # transformers 5's per-layer-type spelling: HF's Llama/Qwen3 fail on it (KeyError)
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     r"rope_parameters per layer type \(full_attention, sliding_attention\) is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                       "original_max_position_embeddings": 32}},
     r"rope_scaling\.long_factor must be a list of numbers"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                       "long_factor": [1.0] * 3, "original_max_position_embeddings": 32}},
     r"rope_scaling\.long_factor must have head_dim / 2 = 8 entries, got 3"),
])
def test_unfollowable_rope_options_are_refused_by_name(hf_config, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig.from_hf({**BASE, **hf_config})


def test_partial_rotary_factor_of_default_rope_is_unread_as_in_transformers():
    cfg = DecoderConfig.from_hf({**BASE, "partial_rotary_factor": 0.5})
    assert cfg.rope_scaling["rope_type"] == "default"  # HF rotates every dim of the head


def test_qwen2_moe_without_shared_expert_is_refused():
    moe = {**BASE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    with pytest.raises(ValueError, match="shared_expert_intermediate_size 0 is not supported"):
        build_model_config({**moe, "shared_expert_intermediate_size": 0})
    assert build_model_config(moe)[1].moe.shared_expert_intermediate_size == 5632  # HF's


def test_gate_activations_are_transformers_act2fn():
    from transformers.activations import ACT2FN

    from compiled_llm.models.config import HIDDEN_ACTS
    from compiled_llm.models.layers import ACTIVATIONS

    assert set(ACTIVATIONS) == set(HIDDEN_ACTS)
    x = torch.linspace(-12, 12, 4001)
    for name in HIDDEN_ACTS:
        torch.testing.assert_close(ACTIVATIONS[name](x), ACT2FN[name](x), msg=name)
