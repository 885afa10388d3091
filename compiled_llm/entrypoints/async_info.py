"""AsyncLLM's read-only facts about its model, as vLLM's AsyncLLM gives them: the model_config
attribute, and the get_model_config and get_tokenizer coroutines (nothing here changes, so
none needs the engine thread)."""

from __future__ import annotations

from compiled_llm.engine.model_config import ModelConfigView


class AsyncInfoMixin:
    """For a class with `engine` (an LLMEngine) and `tokenizer`."""

    @property
    def model_config(self) -> ModelConfigView:
        """vLLM's ModelConfig names over the engine (LLMEngine.model_config)."""
        return self.engine.model_config

    async def get_model_config(self) -> ModelConfigView:
        """model_config (vLLM's AsyncLLM.get_model_config)."""
        return self.engine.model_config

    async def get_tokenizer(self, lora_request=None):
        """The tokenizer (vLLM's AsyncLLM.get_tokenizer; adapters share it)."""
        return self.tokenizer
