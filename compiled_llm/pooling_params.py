"""Pooling runs' settings as vLLM spells them: the runner choice and pooler_config (EngineArgs
fields, through RunnerArgs), and PoolingParams, the per-request settings of embed/classify/score.

Pure Python: the engine reads the model directory's sentence-transformers files to fill in
what pooler_config leaves out (compiled_llm/worker/pooler.py)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Any, Literal

RunnerOption = Literal["auto", "generate", "pooling"]
ConvertOption = Literal["auto", "none", "embed", "classify"]
# vLLM's older `task` (model cards still show LLM(..., task="embed")): a runner by another name
TaskOption = Literal["auto", "generate", "embed", "embedding", "classify", "score", "encode",
                     "reward"]
PoolingType = Literal["MEAN", "CLS", "LAST"]
PoolingTask = Literal["embed", "classify", "score", "encode"]
POOLING_TASKS: tuple[str, ...] = typing.get_args(PoolingTask)
POOLING_TYPES: tuple[str, ...] = typing.get_args(PoolingType)


@dataclass
class PoolerConfig:
    """How hidden states become one vector: pooling_type and L2 normalisation (None: from the
    model directory's sentence-transformers modules, else the model's default)."""

    pooling_type: PoolingType | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooler_config.pooling_type must be one of {POOLING_TYPES}, "
                             f"got {self.pooling_type!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"pooler_config.normalize must be a bool, got {self.normalize!r}")

    @classmethod
    def from_value(cls, value: dict[str, Any] | PoolerConfig | None) -> PoolerConfig:
        """A PoolerConfig from the dict EngineArgs.pooler_config holds; ValueError naming a
        key it does not know."""
        if isinstance(value, PoolerConfig):
            return value
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"pooler_config must be a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"pooler_config.{unknown[0]} is not supported; have {sorted(known)}")
        return cls(**value)


@dataclass
class RunnerArgs:
    """The EngineArgs fields that pick generation or pooling (vLLM's spellings)."""

    runner: RunnerOption = "auto"
    """generate: a language model; pooling: embeddings, classification and scores; auto:
    pooling for encoder-only and classifier architectures, else generate."""
    convert: ConvertOption = "auto"
    """vLLM's model conversion: embed pools a generative checkpoint (runner pooling, last
    token, normalised); classify runs a *ForSequenceClassification checkpoint's head (runner
    pooling); auto and none convert nothing."""
    task: TaskOption | None = None
    """vLLM's older spelling of runner: generate, or embed, classify, score, encode or reward
    (runner pooling); None and auto leave runner as it is."""
    pooler_config: dict | None = None
    """Pooling overrides for runner pooling, e.g. {"pooling_type": "MEAN", "normalize": true}
    (pooling_type MEAN, CLS or LAST; default: the model directory's sentence-transformers
    modules, else CLS for encoders and LAST for decoders, normalised)."""


@dataclass
class PoolingParams:
    """Per-request pooling settings. dimensions: Matryoshka truncation (models that allow it
    only); normalize: L2 normalise embeddings (None: the pooler's setting); use_activation:
    softmax (sigmoid for one label) over classifier logits (None: on; softmax and activation
    are vLLM's older names for it); truncate_prompt_tokens: keep the last k tokens (-1:
    max_model_len); task: vLLM's pooling task, checked and otherwise unused."""

    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None
    # vLLM's older spellings of use_activation (PoolingParams(softmax=False) in model cards)
    softmax: bool | None = None
    activation: bool | None = None
    task: PoolingTask | None = None

    def __post_init__(self) -> None:
        for name in ("use_activation", "softmax", "activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        # vLLM's reading: the first of use_activation, softmax, activation given; else on
        given = [v for v in (self.use_activation, self.softmax, self.activation)
                 if v is not None]
        self.use_activation = given[0] if given else True
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {POOLING_TASKS}, got {self.task!r}")
        if self.dimensions is not None and (isinstance(self.dimensions, bool)
                                            or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be an int >= 1, got {self.dimensions!r}")
        truncate = self.truncate_prompt_tokens
        if truncate is not None and (not isinstance(truncate, int) or truncate == 0
                                     or truncate < -1):
            raise ValueError(f"truncate_prompt_tokens must be -1 or >= 1, got {truncate!r}")
