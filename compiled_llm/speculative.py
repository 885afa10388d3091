"""SpeculativeConfig: the `speculative_config` of LLM/EngineArgs and `--speculative-config`, as
vLLM spells it ({"method": "ngram" | "draft_model" | "medusa" | "eagle" | "eagle3",
"num_speculative_tokens": k, "disable_by_batch_size": n, ...}). Pure Python: parsing and
validation only (reading at most the draft's config.json, to infer a missing method as vLLM
does); the proposers live in sample/spec_decode and worker/."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

SUPPORTED_METHODS = ("ngram", "draft_model", "medusa", "eagle", "eagle3")
# vLLM's other methods: known names, refused clearly until they are implemented here
UNSUPPORTED_METHODS = ("mtp", "mlp_speculator", "suffix", "ngram_gpu", "deepseek_mtp",
                       "mimo_mtp", "ernie_mtp", "glm4_moe_mtp", "qwen3_next_mtp",
                       "longcat_flash_mtp", "pangu_ultra_moe_mtp", "dflash", "dspark",
                       "custom_class", "extract_hidden_states")
_DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min/max when neither is given
_NGRAM_MODELS = ("ngram", "[ngram]")  # vLLM's spellings of prompt lookup as a model or method
# vLLM's fields that change nothing here at None or these values, so a vLLM config spelling
# them is taken (vLLM's EAGLE example sets draft_tensor_parallel_size 1); other values are
# refused by name. The draft runs on the target's one rank, unquantized, from a local directory
# (a Hub id is read as its snapshot directory first: parallel_config.hub_snapshot).
_VLLM_NO_OPS: dict[str, tuple[Any, ...]] = {
    "draft_tensor_parallel_size": (1,), "tensor_parallel_size": (), "quantization": (),
    "max_model_len": (), "revision": (), "code_revision": (), "kv_cache_dtype": ("auto",),
    "moe_backend": (), "attention_backend": (), "speculative_token_tree": (),
    "parallel_drafting": (False,), "rejection_sample_method": ("standard",),
}
# vLLM's knobs of how its drafter runs (eager or graphs, padded batches): any bool is taken,
# as the drafts, and so the output, do not depend on them
_VLLM_RUN_KNOBS = ("enforce_eager", "disable_padded_drafter_batch")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Validated speculative decoding settings. Invariants: method is supported,
    num_speculative_tokens >= 1, 1 <= prompt_lookup_min <= prompt_lookup_max (ngram),
    model is set exactly for draft_model, medusa, eagle and eagle3, disable_by_batch_size is
    None or >= 2 (ngram only):
    a step whose batch has at least that many requests runs without drafts."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    disable_by_batch_size: int | None = None

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | SpeculativeConfig) -> SpeculativeConfig:
        """Parse vLLM's dict; ValueError naming the speculative_config field at fault."""
        if isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {spec!r}")
        spec = _without_vllm_no_ops(spec)
        unknown = sorted(set(spec) - {f.name for f in fields(cls)}, key=repr)
        if unknown:
            raise ValueError(f"speculative_config: unknown fields {unknown}")
        _infer_method(spec)
        _check_method(spec.get("method"))
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError("speculative_config.num_speculative_tokens must be an integer "
                             f">= 1, got {k!r}")
        _check_disable_by_batch_size(spec)
        if spec["method"] == "ngram":
            return cls(**_ngram_lookup(spec))
        return cls(**_draft_model(spec))


def _without_vllm_no_ops(spec: dict[str, Any]) -> dict[str, Any]:
    """spec without vLLM's fields that change nothing here; ValueError naming one set to a
    value that would (a draft on several ranks, a quantized or length-capped draft, ...)."""
    for name, allowed in _VLLM_NO_OPS.items():
        value = spec.get(name)  # None (or absent): vLLM's default
        if value is not None and not any(value == ok and type(value) is type(ok) for ok in allowed):
            raise ValueError(f"speculative_config.{name} is not supported here: only "
                             f"{' or '.join(map(repr, (None, *allowed)))}, got {value!r}")
    for name in _VLLM_RUN_KNOBS:
        value = spec.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"speculative_config.{name} must be a boolean, got {value!r}")
    return {key: value for key, value in spec.items()
            if key not in _VLLM_NO_OPS and key not in _VLLM_RUN_KNOBS}


def _infer_method(spec: dict[str, Any]) -> None:
    """vLLM's reading of a missing or legacy method, in place: "[ngram]" (as method or bare
    model) is ngram; a bare model is an EAGLE head when its name says so ("eagle-", "eagle3"),
    Medusa heads or an MLP speculator when its config.json's model_type says so, else a
    draft model."""
    method, model = spec.get("method"), spec.get("model")
    if method in _NGRAM_MODELS or (method is None and model in _NGRAM_MODELS):
        spec["method"] = "ngram"
    if spec.get("method") == "ngram" and model in _NGRAM_MODELS:
        spec["model"] = None  # vLLM's placeholder model of prompt lookup
    if spec.get("method") is not None or not isinstance(model, str):
        return
    name = model.lower()
    if "eagle-" in name:
        spec["method"] = "eagle"
    elif "eagle3" in name:
        spec["method"] = "eagle3"
    elif _model_type(model) in ("medusa", "mlp_speculator"):
        spec["method"] = _model_type(model)
    else:
        spec["method"] = "draft_model"


def _model_type(model: str) -> str | None:
    """config.json's model_type of a local draft directory (None: none readable)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def _check_method(method: object) -> None:
    if method in SUPPORTED_METHODS:
        return
    if method in UNSUPPORTED_METHODS:
        raise ValueError(f"speculative_config.method {method!r} is not supported yet "
                         f"(supported: {', '.join(SUPPORTED_METHODS)})")
    raise ValueError(f"speculative_config.method must be one of {SUPPORTED_METHODS}, "
                     f"got {method!r}")


def _check_disable_by_batch_size(spec: dict[str, Any]) -> None:
    limit = spec.get("disable_by_batch_size")
    if limit is None:
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 2:
        raise ValueError("speculative_config.disable_by_batch_size must be an integer >= 2, "
                         f"got {limit!r}")
    if spec["method"] != "ngram":
        # the draft model's own KV would miss the tokens of the steps run without drafts
        raise ValueError("speculative_config.disable_by_batch_size is only supported with "
                         "method 'ngram' so far")


def _ngram_lookup(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("model") is not None:
        raise ValueError("speculative_config.model is not used by method 'ngram'")
    low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    # checked as given, before one fills in the other: an error names the field that was set
    for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
    if low is None and high is None:
        low = high = _DEFAULT_LOOKUP
    low, high = (high if low is None else low), (low if high is None else high)
    if low > high:
        raise ValueError(f"speculative_config.prompt_lookup_min ({low}) must be <= "
                         f"prompt_lookup_max ({high})")
    return {**spec, "prompt_lookup_min": low, "prompt_lookup_max": high}


def _draft_model(spec: dict[str, Any]) -> dict[str, Any]:
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("speculative_config.model (the draft model's or heads' directory) is "
                         f"required for method {spec['method']!r}")
    for name in ("prompt_lookup_min", "prompt_lookup_max"):
        if spec.get(name) is not None:
            raise ValueError(f"speculative_config.{name} is only for method 'ngram'")
    return spec


def check_speculative(args: Any) -> None:
    """ValueError naming the field when EngineArgs' speculative_config is malformed or asks for
    what it cannot be combined with (LoRA adapters: not yet)."""
    if speculative_config_of(args.speculative_config) is not None and getattr(
            args, "enable_lora", False):
        raise ValueError("speculative_config is not supported with enable_lora yet")


def speculative_config_of(spec: dict[str, Any] | SpeculativeConfig | None
                          ) -> SpeculativeConfig | None:
    """The parsed config of an EngineArgs.speculative_config value (None: spec decoding off)."""
    return None if spec is None else SpeculativeConfig.from_dict(spec)
