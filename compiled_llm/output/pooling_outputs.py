"""Pooling results, shaped like vLLM's: EmbeddingRequestOutput (.outputs.embedding),
ClassificationRequestOutput (.outputs.probs), ScoringRequestOutput (.outputs.score) and
PoolingRequestOutput (.outputs.data, a tensor), each with request_id, prompt_token_ids,
num_cached_tokens and finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EmbeddingOutput:
    """One prompt's embedding."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        """The embedding's length."""
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    """One prompt's class probabilities (softmax; sigmoid for one label)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        """How many labels the classifier has."""
        return len(self.probs)


@dataclass
class ScoringOutput:
    """One pair's relevance score."""

    score: float


@dataclass(eq=False)
class PoolingOutput:
    """The pooler's raw output for one prompt (its embedding or class probabilities), a 1-D
    torch.Tensor on the CPU as vLLM's."""

    data: Any

    def __eq__(self, other: object) -> bool:
        import torch  # the data is one; this module is imported before torch may be

        return isinstance(other, self.__class__) and torch.equal(self.data, other.data)


@dataclass
class PoolingRequestOutput:
    """A finished pooling request; `outputs` is one of the *Output types above."""

    request_id: str
    outputs: Any
    prompt_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # vLLM's field: pooling takes nothing from a prefix cache here
    finished: bool = True


class EmbeddingRequestOutput(PoolingRequestOutput):
    """llm.embed's result: outputs is an EmbeddingOutput."""


class ClassificationRequestOutput(PoolingRequestOutput):
    """llm.classify's result: outputs is a ClassificationOutput."""


class ScoringRequestOutput(PoolingRequestOutput):
    """llm.score's result: outputs is a ScoringOutput."""
