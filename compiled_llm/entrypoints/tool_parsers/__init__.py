"""Tool-call parsers by name (`--tool-call-parser NAME`): each one small module whose class
turns a model family's tool-call text into OpenAI tool calls, whole or streaming."""

from __future__ import annotations

import importlib

from compiled_llm.entrypoints.tool_parsers.base import ToolParser

# name -> "module:class", imported on first use (the CLI lists the names without importing)
TOOL_PARSERS: dict[str, str] = {
    "hermes": "hermes:HermesToolParser",
    "llama3_json": "llama3_json:Llama3JsonToolParser",
    "mistral": "mistral:MistralToolParser",
    "qwen3_coder": "qwen3_coder:Qwen3CoderToolParser",
    "pythonic": "pythonic:PythonicToolParser",
    "glm45": "glm4:Glm4ToolParser",
    "glm47": "glm4:Glm4ToolParser",  # vLLM reads 4.5's and 4.7's layouts with one parser
    "deepseek_v3": "deepseek:DeepSeekV3ToolParser",
    "deepseek_v31": "deepseek:DeepSeekV31ToolParser",
    "granite": "granite:GraniteToolParser",
    "phi4_mini_json": "phi4_mini:Phi4MiniJsonToolParser",
    "llama4_pythonic": "llama4_pythonic:Llama4PythonicToolParser",
    "seed_oss": "seed_oss:SeedOssToolParser",
    "minimax_m2": "minimax_m2:MinimaxM2ToolParser",
    "openai": "harmony:HarmonyToolParser",  # gpt-oss's harmony calls
    # vLLM's other names for formats above (the same parser class there)
    "llama4_json": "llama3_json:Llama3JsonToolParser",
    "qwen3_xml": "qwen3_coder:Qwen3CoderToolParser",
    "mimo": "qwen3_coder:Qwen3CoderToolParser",
    # more of vLLM's families
    "gemma4": "gemma4:Gemma4ToolParser",
    "apertus": "apertus:ApertusToolParser",
    "hy_v3": "hy_v3:HYV3ToolParser",
    "hunyuan_a13b": "hunyuan_a13b:HunyuanA13BToolParser",
    "ernie45": "ernie45:Ernie45ToolParser",
    "olmo3": "olmo3:Olmo3ToolParser",
    "kimi_k2": "kimi_k2:KimiK2ToolParser",
    "longcat": "longcat:LongcatFlashToolParser",
    "internlm": "internlm:Internlm2ToolParser",
    "jamba": "jamba:JambaToolParser",
    "xlam": "xlam:XLAMToolParser",
    "granite4": "granite4:Granite4ToolParser",
    "granite-20b-fc": "granite_20b_fc:Granite20bFCToolParser",
    "step3": "step3:Step3ToolParser",
}


def check_tool_parser(name: str) -> None:
    """ValueError listing the known parsers unless name is one."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got {name!r}")


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as name (ValueError listing the known ones otherwise)."""
    check_tool_parser(name)
    module, cls = TOOL_PARSERS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
