"""vLLM's `vllm.inputs` path for the prompt types, so `from vllm.inputs import TokensPrompt`
becomes `from compiled_llm.inputs import TokensPrompt`."""

from compiled_llm.engine.inputs import PromptType, TextPrompt, TokensPrompt

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
