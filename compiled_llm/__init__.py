"""compiled-llm: plain PyTorch models, made fast by the compiler, driven by a small scheduler."""

from compiled_llm.llm import LLM
from compiled_llm.outputs import CompletionOutput, Logprob, RequestOutput
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams
from compiled_llm.structured_outputs import StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "StructuredOutputsParams", "RequestOutputKind"]
__version__ = "0.1.0"
