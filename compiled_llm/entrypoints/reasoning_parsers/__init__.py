"""Reasoning parsers by name (`--reasoning-parser NAME`): where a model's thinking span is,
so that it goes to `reasoning_content` and constraints start after it."""

from __future__ import annotations

from compiled_llm.entrypoints.reasoning_parsers.base import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)
from compiled_llm.entrypoints.reasoning_parsers.families import (
    DeepSeekV3ReasoningParser,
    Ernie45ReasoningParser,
    Gemma4ReasoningParser,
    GptOssReasoningParser,
    GraniteReasoningParser,
    HunyuanA13BReasoningParser,
    MiniMaxM2AppendThinkReasoningParser,
    MiniMaxM2ReasoningParser,
    MistralReasoningParser,
    Olmo3ReasoningParser,
    SeedOssReasoningParser,
)

# vLLM's names
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "ernie45": Ernie45ReasoningParser,
    "gemma4": Gemma4ReasoningParser,
    "glm45": Qwen3ReasoningParser,  # GLM-4.5 writes the same <think>...</think> span
    "granite": GraniteReasoningParser,
    "hunyuan_a13b": HunyuanA13BReasoningParser,
    "minimax_m2": MiniMaxM2ReasoningParser,
    "minimax_m2_append_think": MiniMaxM2AppendThinkReasoningParser,
    "mistral": MistralReasoningParser,
    "olmo3": Olmo3ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "seed_oss": SeedOssReasoningParser,
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser registered as name; ValueError listing the known ones otherwise."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, "
                         f"got {name!r}")
    return REASONING_PARSERS[name]
