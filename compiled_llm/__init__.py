"""compiled-llm: plain PyTorch models, made fast by the compiler, driven by a small scheduler."""

from compiled_llm.llm import LLM
from compiled_llm.outputs import CompletionOutput, Logprob, RequestOutput
from compiled_llm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"
