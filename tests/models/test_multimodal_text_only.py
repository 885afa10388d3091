"""Image-text-to-text checkpoints (XForConditionalGeneration) served on text-only prompts: each
equals transformers' own XForConditionalGeneration on input_ids (greedy tokens and prompt
logprobs, random norms), from either weight layout; M-RoPE on text equals plain RoPE; what
would differ (or multimodal input) is refused by name."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.rotary import RotaryEmbedding
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import edited_checkpoint, hf_model, make_checkpoint, random_prompts

ARCHS = {"gemma3_vl": "Gemma3ForConditionalGeneration",
         "qwen2_vl": "Qwen2VLForConditionalGeneration",
         "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
         "qwen3_vl": "Qwen3VLForConditionalGeneration",
         "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
         "mistral3": "Mistral3ForConditionalGeneration",
         "llava": "LlavaForConditionalGeneration",
         "gemma4_vl": "Gemma4ForConditionalGeneration",
         "aria_vl": "AriaForConditionalGeneration",
         "emu3_vl": "Emu3ForConditionalGeneration"}


def _random_norms(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights and biases drawn (transformers saves ones and zeros), a router's too."""
    if key.endswith(("norm.weight", ".bias", "mlp.gate.weight")):
        return value + torch.randn(value.shape, generator=gen) * 0.3
    return None


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_text_only_matches_transformers(name):
    ckpt = edited_checkpoint(name, _random_norms)
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == [ARCHS[name]]
    prompts = random_prompts(3, 300, lo=4, hi=24, seed=4)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    assert llm.engine.model_config.architecture == ARCHS[name]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    hf = hf_model(ckpt)
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():  # one forward over prompt + output: greedy is each row's argmax
            ref = hf(input_ids=torch.tensor([prompt + tokens])).logits[0].log_softmax(-1)
        assert ref[len(prompt) - 1:-1].argmax(-1).tolist() == tokens
        expected = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        got = torch.tensor([d[t].logprob
                            for d, t in zip(out.prompt_logprobs[1:], prompt[1:], strict=True)])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _copy(name: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-copy-"))
    shutil.copytree(make_checkpoint(name), out, dirs_exist_ok=True)
    return out


@pytest.mark.parametrize("name, old, new", [
    # transformers 5 saves Mistral 3 / Llava / Gemma 3 in 4.x's layout, Qwen2.5-VL in its
    # released flat one: each renamed to transformers 5's own (model.language_model.*)
    ("mistral3", "language_model.model.", "model.language_model."),
    ("llava", "language_model.", ""),
    ("qwen2_5_vl", "model.", "model.language_model."),
])
def test_either_weight_layout_loads_the_same(name, old, new):
    from safetensors.torch import load_file, save_file

    ckpt = _copy(name)
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    renamed = {(new + key[len(old):] if key.startswith(old) else key): value
               for key, value in tensors.items()}
    if name == "llava":  # language_model.model.* -> model.*, .lm_head -> lm_head
        renamed = {key.replace("model.", "model.language_model.", 1)
                   if key.startswith("model.") else key: value for key, value in renamed.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, path, metadata={"format": "pt"})
    ours = [load_model(d, torch.float32, torch.device("cpu"), 64).state_dict()
            for d in (make_checkpoint(name), ckpt)]
    assert ours[0].keys() == ours[1].keys()
    assert all(torch.equal(ours[0][k], ours[1][k]) for k in ours[0])
    ids = torch.tensor([[5, 9, 30, 2, 7]])
    with torch.no_grad():  # transformers reads the renamed files as the same model
        torch.testing.assert_close(hf_model(ckpt)(input_ids=ids).logits,
                                   hf_model(make_checkpoint(name))(input_ids=ids).logits)


def test_vision_tensors_skipped_and_heads_tied_as_transformers():
    cfg = {n: build_model_config(load_hf_config(make_checkpoint(n)))[1] for n in ARCHS}
    # Gemma 3 and 4 and Mistral 3 (tied at the top level) store no head; Qwen3-VL-MoE's
    # text_config says tied, the top level not (transformers 5 reads the top): it stores its own
    assert {n for n, c in cfg.items() if c.tie_word_embeddings} == {"gemma3_vl", "gemma4_vl",
                                                                     "mistral3"}
    assert cfg["qwen3_vl_moe"].moe.norm_topk_prob  # its router renormalises, unasked
    assert cfg["qwen2_5_vl"].rope_scaling == {"rope_type": "default"}


def test_legacy_flat_qwen2_5_vl_config():
    """Released Qwen2.5-VL configs: text keys at the top level, rope_scaling type "mrope"."""
    ckpt = _copy("qwen2_5_vl")
    hf = json.loads((ckpt / "config.json").read_text())
    text = hf.pop("text_config")
    text.pop("model_type")
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
    text["rope_theta"] = text.pop("rope_parameters")["rope_theta"]
    (ckpt / "config.json").write_text(json.dumps({**hf, **text}))
    flat = build_model_config(load_hf_config(ckpt))
    nested = build_model_config(load_hf_config(make_checkpoint("qwen2_5_vl")))
    assert flat[0] is nested[0] and flat[1] == nested[1]
    ids = torch.tensor([[5, 9, 30, 2, 7]])
    with torch.no_grad():  # transformers reads it as the same model too
        torch.testing.assert_close(hf_model(ckpt)(input_ids=ids).logits,
                                   hf_model(make_checkpoint("qwen2_5_vl"))(input_ids=ids).logits)


@pytest.mark.parametrize("module, cls, section, interleaved", [
    ("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", [16, 24, 24], False),
    ("qwen3_vl", "Qwen3VLTextRotaryEmbedding", [24, 20, 20], True),
])
def test_mrope_on_text_positions_is_plain_rope(module, cls, section, interleaved):
    """transformers' M-RoPE with the three position rows equal (text) gives plain RoPE's
    cos / sin, which ours computes."""
    import importlib

    import transformers

    config_cls = {"qwen2_5_vl": "Qwen2_5_VLTextConfig", "qwen3_vl": "Qwen3VLTextConfig"}[module]
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section,
            **({"mrope_interleaved": True} if interleaved else {})}
    text = getattr(transformers, config_cls)(hidden_size=1024, num_attention_heads=8,
                                             head_dim=128, rope_parameters=rope)
    theirs = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                     cls)(text)
    positions = torch.arange(40)
    cos, sin = theirs(torch.zeros(1), positions.view(1, 1, -1).expand(3, 1, -1))
    ours = RotaryEmbedding(DecoderConfig(
        vocab_size=8, hidden_size=1024, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=8, head_dim=128, rope_theta=1e6), 64)
    our_cos, our_sin = ours(positions)
    torch.testing.assert_close(our_cos.reshape(40, -1), cos[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(our_sin.reshape(40, -1), sin[0], atol=1e-6, rtol=1e-6)


def _edited_config(name: str, edit) -> Path:
    ckpt = _copy(name)
    hf = json.loads((ckpt / "config.json").read_text())
    edit(hf)
    (ckpt / "config.json").write_text(json.dumps(hf))
    return ckpt


@pytest.mark.parametrize("name, edit, field", [
    ("llava", lambda hf: hf["text_config"].update(model_type="gemma2"), "text_config.model_type"),
    ("qwen2_5_vl", lambda hf: hf["text_config"]["rope_parameters"].update(
        mrope_section=[2, 2, 2]), "rope_parameters.mrope_section"),
    ("mistral3", lambda hf: hf.update(quantization_config={"quant_method": "fp8"}),
     "quantization_config"),
    ("gemma3_vl", lambda hf: hf["text_config"].update(use_bidirectional_attention=True),
     "use_bidirectional_attention"),
])
def test_refused_by_name(name, edit, field):
    with pytest.raises(ValueError, match=field):
        build_model_config(load_hf_config(_edited_config(name, edit)))


def test_multimodal_prompt_refused_and_chat_template_with_text_parts():
    ckpt = _copy("gemma3_vl")
    tok = json.loads((ckpt / "tokenizer_config.json").read_text())
    # a multimodal model's template: content a list of typed parts (it drops a plain string)
    template = ("{% for m in messages %}<{{ m['role'] }}>{% for part in m['content'] %}"
                "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}\n"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    (ckpt / "chat_template.jinja").write_text(template)
    tok.pop("chat_template", None)
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tok))
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate({"prompt": "a cat", "multi_modal_data": {"image": object()}})
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    messages = [{"role": "user", "content": [{"type": "text", "text": "The quick fox"}]}]
    out = llm.chat(messages, params, use_tqdm=False)[0]
    assert out.prompt == "<user>The quick fox<assistant>"  # (trim_blocks eats the newline)
    llm.shutdown()
