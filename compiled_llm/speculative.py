"""SpeculativeConfig: the `speculative_config` of LLM/EngineArgs and `--speculative-config`, as
vLLM spells it ({"method": "ngram" | "draft_model" | "medusa" | "eagle" | "eagle3",
"num_speculative_tokens": k, "disable_by_batch_size": n, ...}). Pure Python: parsing and
validation only; the proposers live in sample/spec_decode and worker/."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

SUPPORTED_METHODS = ("ngram", "draft_model", "medusa", "eagle", "eagle3")
# vLLM's other methods: known names, refused clearly until they are implemented here
UNSUPPORTED_METHODS = ("mtp", "mlp_speculator", "suffix",
                       "ngram_gpu", "deepseek_mtp")
_DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min/max when neither is given


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
        unknown = sorted(set(spec) - {f.name for f in fields(cls)}, key=repr)
        if unknown:
            raise ValueError(f"speculative_config: unknown fields {unknown}")
        spec = dict(spec)
        if spec.get("method") is None and spec.get("model") is not None:
            spec["method"] = "draft_model"  # vLLM infers the method from a bare draft model
        _check_method(spec.get("method"))
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError("speculative_config.num_speculative_tokens must be an integer "
                             f">= 1, got {k!r}")
        _check_disable_by_batch_size(spec)
        if spec["method"] == "ngram":
            return cls(**_ngram_lookup(spec))
        return cls(**_draft_model(spec))


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
    if low is None and high is None:
        low = high = _DEFAULT_LOOKUP
    low, high = (high if low is None else low), (low if high is None else high)
    for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
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
