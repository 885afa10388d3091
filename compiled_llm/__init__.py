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
    "AsyncLLMEngine": "compiled_llm.entrypoints.async_llm",
    "LLMEngine": "compiled_llm.engine.llm_engine",
    "EngineArgs": "compiled_llm.config",
    "SamplingParams": "compiled_llm.sampling_params",
    "StructuredOutputsParams": "compiled_llm.sampling_params",
    "RequestOutputKind": "compiled_llm.sampling_params",
    "RequestOutput": "compiled_llm.output.outputs",
    "CompletionOutput": "compiled_llm.output.outputs",
    "Logprob": "compiled_llm.output.outputs",
    "ModelRegistry": "compiled_llm.models",
    "LoRARequest": "compiled_llm.lora.request",
    "AsyncEngineArgs": "compiled_llm.engine.arg_utils",
    "TextPrompt": "compiled_llm.engine.inputs",
    "TokensPrompt": "compiled_llm.engine.inputs",
    "PromptType": "compiled_llm.engine.inputs",
    "PoolingParams": "compiled_llm.pooling_params",
    "PoolingOutput": "compiled_llm.output.pooling_outputs",
    "PoolingRequestOutput": "compiled_llm.output.pooling_outputs",
    "EmbeddingOutput": "compiled_llm.output.pooling_outputs",
    "EmbeddingRequestOutput": "compiled_llm.output.pooling_outputs",
    "ClassificationOutput": "compiled_llm.output.pooling_outputs",
    "ClassificationRequestOutput": "compiled_llm.output.pooling_outputs",
    "ScoringOutput": "compiled_llm.output.pooling_outputs",
    "ScoringRequestOutput": "compiled_llm.output.pooling_outputs",
}

if TYPE_CHECKING:
    from compiled_llm.config import EngineArgs
    from compiled_llm.engine.arg_utils import AsyncEngineArgs
    from compiled_llm.engine.inputs import PromptType, TextPrompt, TokensPrompt
    from compiled_llm.engine.llm_engine import LLMEngine
    from compiled_llm.entrypoints.async_llm import AsyncLLM, AsyncLLMEngine
    from compiled_llm.entrypoints.llm import LLM
    from compiled_llm.lora.request import LoRARequest
    from compiled_llm.models import ModelRegistry
    from compiled_llm.output.outputs import CompletionOutput, Logprob, RequestOutput
    from compiled_llm.output.pooling_outputs import (
        ClassificationOutput,
        ClassificationRequestOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        PoolingOutput,
        PoolingRequestOutput,
        ScoringOutput,
        ScoringRequestOutput,
    )
    from compiled_llm.pooling_params import PoolingParams
    from compiled_llm.sampling_params import (
        RequestOutputKind,
        SamplingParams,
        StructuredOutputsParams,
    )

__all__ = ["LLM", "AsyncLLM", "AsyncLLMEngine", "LLMEngine", "EngineArgs", "AsyncEngineArgs",
           "SamplingParams", "StructuredOutputsParams", "RequestOutputKind", "RequestOutput",
           "CompletionOutput", "Logprob", "ModelRegistry", "LoRARequest", "TextPrompt",
           "TokensPrompt", "PromptType", "PoolingParams", "PoolingOutput", "PoolingRequestOutput",
           "EmbeddingOutput", "EmbeddingRequestOutput", "ClassificationOutput",
           "ClassificationRequestOutput", "ScoringOutput", "ScoringRequestOutput"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import a public name on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'compiled_llm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
