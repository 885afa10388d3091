"""AsyncLLM's LoRA adapter calls, vLLM's coroutines: add_lora, remove_lora, list_loras and
pin_lora, each the LLMEngine's own run between steps on the engine loop's thread (the thread
that owns the engine's adapter list, which requests are checked against)."""

from __future__ import annotations

from compiled_llm.lora.request import LoRARequest


class AsyncLoRAMixin:
    """The calls, for a class with `engine` (an LLMEngine) and `call` (await a function run
    on the engine thread between steps; its ValueError raised to the caller)."""

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """LLMEngine.add_lora: True once added; ValueError naming the field for a bad one."""
        return await self.call(self.engine.add_lora, lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        """LLMEngine.remove_lora: False if not added; its id names no other adapter."""
        return await self.call(self.engine.remove_lora, lora_id)

    async def list_loras(self) -> set[int]:
        """LLMEngine.list_loras: the ids of the adapters added and not removed."""
        return await self.call(self.engine.list_loras)

    async def pin_lora(self, lora_id: int) -> bool:
        """LLMEngine.pin_lora: refused (NotImplementedError)."""
        return await self.call(self.engine.pin_lora, lora_id)
