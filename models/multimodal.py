"""Image-text-to-text checkpoints (XForConditionalGeneration) served on text-only prompts: their
config.json read as the text model's own (text_config, whose model_type picks our text class),
the language model's tensors renamed from either transformers layout onto that class, the
vision tower's and projector's skipped. Images, audio and video are not taken (wave 3)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

# architecture -> (its text_config model_types -> our text architecture; transformers 5's
# tie_word_embeddings default for the architecture). Legacy Qwen2-VL / Qwen2.5-VL configs hold
# the text keys at the top level, under the outer model_type.
QWEN2_TEXT = "Qwen2ForCausalLM"
LLAVA_TEXTS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": QWEN2_TEXT}
CONDITIONAL_GENERATION: dict[str, tuple[dict[str, str], bool]] = {
    "Gemma3ForConditionalGeneration": ({"gemma3_text": "Gemma3ForCausalLM"}, True),
    "Qwen2VLForConditionalGeneration": (
        {"qwen2_vl_text": QWEN2_TEXT, "qwen2_vl": QWEN2_TEXT}, False),
    "Qwen2_5_VLForConditionalGeneration": (
        {"qwen2_5_vl_text": QWEN2_TEXT, "qwen2_5_vl": QWEN2_TEXT}, False),
    "Qwen3VLForConditionalGeneration": ({"qwen3_vl_text": "Qwen3ForCausalLM"}, False),
    "Qwen3VLMoeForConditionalGeneration": ({"qwen3_vl_moe_text": "Qwen3MoeForCausalLM"}, False),
    "Mistral3ForConditionalGeneration": (
        {"mistral": "MistralForCausalLM", "llama": "LlamaForCausalLM",
         "ministral3": "Ministral3ForCausalLM"}, True),
    "LlavaForConditionalGeneration": (LLAVA_TEXTS, False),
    "Gemma4ForConditionalGeneration": ({"gemma4_text": "Gemma4ForCausalLM"}, True),
    # Gemma 3n: its vision / audio token ids have embedders of their own, kept (hard tokens)
    "Gemma3nForConditionalGeneration": ({"gemma3n_text": "Gemma3nForCausalLM"}, True),
    "Llama4ForConditionalGeneration": ({"llama4_text": "Llama4ForCausalLM"}, False),
    "AriaForConditionalGeneration": ({"aria_text": "AriaTextForCausalLM"}, False),
    # Emu3's image tokens are ids of the text vocabulary: text-only, it is its LM alone
    "Emu3ForConditionalGeneration": ({"emu3_text_model": "Emu3ForCausalLM"}, False),
    # Cohere Compass: its text_config's per-layer-type M-RoPE is read by the text class
    "CohereCompassForConditionalGeneration": (
        {"cohere_compass_text": "CohereCompassForCausalLM"}, False),
}
# config.json keys outside the text model: they stay out of a legacy flat config's text view
NOT_TEXT = ("architectures", "model_type", "text_config", "vision_config", "audio_config",
            "tie_word_embeddings")
# top-level keys the text view keeps (the checkpoint's dtype and format, the token ids)
SHARED = ("dtype", "torch_dtype", "quantization_config", "transformers_version",
          "bos_token_id", "eos_token_id", "pad_token_id")
# tensors of the vision (or audio) side, under an optional `model.` prefix: skipped
NOT_LANGUAGE = ("vision_tower.", "visual.", "multi_modal_projector.", "vision_model.",
                "embed_vision.", "audio_tower.", "embed_audio.", "vqmodel.")
# the language model's prefixes: transformers 5's, 4.x's (Llava-style) -> ours; Emu3's
# text_model likewise
PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."), ("model.text_model.", "model."),
            ("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."))


def text_stack_config(hf_config: dict[str, Any], model_dir: str | Path) -> dict[str, Any]:
    """config.json as the engine reads it: for a registered XForConditionalGeneration, its text
    model's config (architectures kept: the registry maps them to ConditionalGeneration), the
    head tied as transformers 5 ties it; any other config as it is."""
    arch = next((a for a in hf_config.get("architectures") or ()
                 if a in CONDITIONAL_GENERATION), None)
    if arch is None:
        return hf_config
    texts, tie_default = CONDITIONAL_GENERATION[arch]
    nested = hf_config.get("text_config")
    text = dict(nested) if isinstance(nested, dict) else {
        key: value for key, value in hf_config.items() if key not in NOT_TEXT}
    model_type = text.get("model_type") or (hf_config.get("model_type") if nested is None
                                            else None)
    if model_type not in texts:
        raise ValueError(f"text_config.model_type {model_type!r} is not supported for {arch}; "
                         f"have {sorted(texts)}")
    text["model_type"] = model_type
    if "quantization_config" in hf_config:
        raise ValueError(f"quantization_config: quantized {arch} checkpoints are not supported "
                         "yet (their vision modules' formats differ)")
    shared = {key: hf_config[key] for key in SHARED if key in hf_config}
    text = {**shared, **{k: v for k, v in text.items() if k not in ("dtype", "torch_dtype")}}
    text["architectures"] = [arch]
    text["text_architecture"] = texts[model_type]
    text["tie_word_embeddings"] = _tied(hf_config, text, tie_default, model_dir)
    _text_only_rope(text)
    if model_type == "gemma3_text":  # Gemma3ForConditionalGeneration never soft-caps logits
        text["final_logit_softcapping"] = None
    if model_type == "gemma3n_text":  # the vision / audio ids' embedders (text-only served)
        text["hard_token_embedders"] = {"embed_vision": hf_config.get("vision_config"),
                                        "embed_audio": hf_config.get("audio_config")}
    if model_type == "qwen3_vl_moe_text":  # its router renormalises the top-k, unasked
        text["norm_topk_prob"] = True
    return text


def _tied(hf_config: dict[str, Any], text: dict[str, Any], default: bool,
          model_dir: str | Path) -> bool:
    """transformers 5 ties the head where the top-level tie_word_embeddings (else the class
    default; pre-v5 saves put it in text_config) says so, unless the checkpoint stores a head
    of its own (then both are kept apart): so do we."""
    tie = hf_config.get("tie_word_embeddings", default) or bool(text.get("tie_word_embeddings"))
    return bool(tie) and not _stores_head(Path(model_dir))


def _stores_head(model_dir: Path) -> bool:
    """Whether the checkpoint's safetensors hold an lm_head weight (read from the index or the
    file headers alone); False for pickle checkpoints, whose names cost a full read."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = json.loads(index.read_text())["weight_map"]
    else:
        from safetensors import safe_open

        names = []
        for path in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as reader:
                names += list(reader.keys())  # noqa: SIM118 (safe_open has no __iter__)
    return any(language_model_name(name) == "lm_head.weight" for name in names)


def _text_only_rope(text: dict[str, Any]) -> None:
    """M-RoPE (Qwen-VL) turns each of its sections by the temporal, height or width position;
    for text alone the three are the same position, so it is the plain rope it is based on
    (its rope_type "mrope" spells "default"). Qwen2-VL's sections must tile the rotated half
    (transformers splits by them)."""
    for key in ("rope_scaling", "rope_parameters"):
        params = text.get(key)
        if not isinstance(params, dict) or "mrope_section" not in params:
            continue
        params = dict(params)
        section = params.pop("mrope_section")
        interleaved = params.pop("mrope_interleaved", False)
        if params.get("rope_type", params.get("type")) == "mrope":
            params.pop("type", None)
            params["rope_type"] = "default"
        heads = text.get("num_attention_heads") or 1
        head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
        if not interleaved and sum(section) != head_dim // 2:
            raise ValueError(f"{key}.mrope_section {section!r} must sum to head_dim / 2 = "
                             f"{head_dim // 2}")
        text[key] = params


def language_model_name(hf_name: str) -> str | None:
    """The text model's name for a checkpoint tensor (as a text-only checkpoint names it), or
    None for the vision side's."""
    for theirs, ours in PREFIXES:
        if hf_name.startswith(theirs):
            return ours + hf_name[len(theirs):]
    if hf_name.removeprefix("model.").startswith(NOT_LANGUAGE):
        return None
    return hf_name  # the legacy Qwen2-VL layout: model.layers.*, lm_head.*


class StackedExpertTensor(NamedTuple):
    """All experts' gate_up_proj (or down_proj) in one tensor (Qwen3-VL-MoE): filling `name`
    whole, stored as ours ([E, 2I, H], [E, H, I]) or transposed (its released files), told
    apart by shape as transformers does."""

    name: str
    shape: tuple[int, int, int]

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The whole parameter."""
        return param

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor in our layout."""
        return tensor if tuple(tensor.shape) == self.shape else tensor.transpose(1, 2)


class TextStack:
    """Mixin before a text model class: checkpoint names of the whole image-text-to-text model
    mapped onto the text model's (vision tensors skipped) before its own weight_name."""

    def weight_name(self, hf_name: str):
        """Our parameter (or part) for a checkpoint tensor, None to skip."""
        name = language_model_name(hf_name)
        own = hf_name.removeprefix("model.")
        if name is None and own.startswith(getattr(self, "text_side_modules", ())):
            name = f"model.{own}"  # a text class's own use of a multimodal module (Gemma 3n)
        if name is None:
            return None
        prefix, _, proj = name.rpartition(".experts.")
        moe = self.config.moe
        # a text class that maps its stacked experts itself (Aria: transposed, whatever the
        # shapes) is not told apart by shape here
        if (moe is not None and proj in ("gate_up_proj", "down_proj")
                and not getattr(self, "stacked_experts_transposed", False)):
            experts, inter, hidden = moe.num_experts, moe.moe_intermediate_size, \
                self.config.hidden_size
            if proj == "gate_up_proj":
                return StackedExpertTensor(f"{prefix}.experts.w13_weight",
                                           (experts, 2 * inter, hidden))
            return StackedExpertTensor(f"{prefix}.experts.w2_weight", (experts, hidden, inter))
        return super().weight_name(name)

    @classmethod
    def check_tensor_parallel(cls, config, size: int) -> None:
        """ValueError for mixture-of-experts text models whose stacked experts this class
        reads (no shard plan for them yet; Llama 4's own class reads and shards its); else the
        text class's own check."""
        if config.moe is not None and not getattr(cls, "stacked_experts_transposed", False):
            raise ValueError(f"tensor_parallel_size {size}: {config.architecture} is not "
                             "sharded yet (run it with 1)")
        getattr(super(), "check_tensor_parallel", lambda *args: None)(config, size)


@functools.cache
def text_stack_cls(text_cls: type) -> type:
    """text_cls taking an image-text-to-text checkpoint's names (one class per text class)."""
    attrs = {"__module__": __name__, "__doc__": f"{text_cls.__name__} on the text stack of an "
             "image-text-to-text checkpoint."}
    return type(f"{text_cls.__name__}TextStack", (TextStack, text_cls), attrs)


class ConditionalGeneration:
    """What the registry maps each XForConditionalGeneration to: the loader builds the text
    model class its text_config names (text_model_cls), never this one."""

    is_pooling_model = False

    @staticmethod
    def text_model_cls(hf_config: dict[str, Any], resolve) -> type:
        """The text model's class (through `resolve`, the registry's) for a text_stack_config
        view, taking the whole checkpoint's tensor names."""
        return text_stack_cls(resolve([hf_config["text_architecture"]]))
