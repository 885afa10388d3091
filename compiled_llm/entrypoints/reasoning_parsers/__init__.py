"""Reasoning parsers by name (`--reasoning-parser NAME`): where a model's thinking span is,
so that it goes to `reasoning_content` and constraints start after it."""

from __future__ import annotations

from compiled_llm.entrypoints.reasoning_parsers.base import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "glm45": Qwen3ReasoningParser,  # GLM-4.5 writes the same <think>...</think> span
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser registered as name; ValueError listing the known ones otherwise."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, "
                         f"got {name!r}")
    return REASONING_PARSERS[name]
