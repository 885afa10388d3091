"""Model registry: HF `architectures` names -> model classes, imported lazily."""

from __future__ import annotations

import importlib

from compiled_llm.models.config import DecoderConfig

_REGISTRY: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def get_model_class(architectures: list[str]):
    """The class for the first supported name; ValueError naming them all otherwise."""
    for arch in architectures:
        if arch in _REGISTRY:
            module, name = _REGISTRY[arch]
            return getattr(importlib.import_module(f"compiled_llm.models.{module}"), name)
    raise ValueError(
        f"architectures {architectures} not supported; supported: {supported_architectures()}"
    )


__all__ = ["DecoderConfig", "get_model_class", "supported_architectures"]
