"""vLLM's `vllm.outputs` path for the output types, so `from vllm.outputs import RequestOutput`
becomes `from compiled_llm.outputs import RequestOutput`."""

from compiled_llm.output.outputs import CompletionOutput, RequestOutput
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

__all__ = ["ClassificationOutput", "ClassificationRequestOutput", "CompletionOutput",
           "EmbeddingOutput", "EmbeddingRequestOutput", "PoolingOutput", "PoolingRequestOutput",
           "RequestOutput", "ScoringOutput", "ScoringRequestOutput"]
