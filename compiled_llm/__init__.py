"""compiled-llm: plain PyTorch models, made fast by the compiler, driven by a small scheduler.

The public names load lazily, so importing a pure-Python layer (compiled_llm.core) does not
import torch; before any of them, bytecode_cache keeps torch's bytecode where Python keeps none.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from compiled_llm import bytecode_cache

bytecode_cache.enable()  # before torch is imported: a no-op where its bytecode is kept

_PUBLIC = {
    "LLM": "compiled_llm.entrypoints.llm",
    "AsyncLLM": "compiled_llm.entrypoints.async_llm",
    "EngineArgs": "compiled_llm.config",
    "SamplingParams": "compiled_llm.sampling_params",
    "StructuredOutputsParams": "compiled_llm.sampling_params",
    "RequestOutputKind": "compiled_llm.sampling_params",
    "RequestOutput": "compiled_llm.output.outputs",
    "CompletionOutput": "compiled_llm.output.outputs",
    "Logprob": "compiled_llm.output.outputs",
    "ModelRegistry": "compiled_llm.models",
    "LoRARequest": "compiled_llm.lora.request",
}

if TYPE_CHECKING:
    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.async_llm import AsyncLLM
    from compiled_llm.entrypoints.llm import LLM
    from compiled_llm.lora.request import LoRARequest
    from compiled_llm.models import ModelRegistry
    from compiled_llm.output.outputs import CompletionOutput, Logprob, RequestOutput
    from compiled_llm.sampling_params import (
        RequestOutputKind,
        SamplingParams,
        StructuredOutputsParams,
    )

__all__ = ["LLM", "AsyncLLM", "EngineArgs", "SamplingParams", "StructuredOutputsParams",
           "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob", "ModelRegistry",
           "LoRARequest"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import a public name on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'compiled_llm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
