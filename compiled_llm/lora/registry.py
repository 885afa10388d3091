"""The front end's check of a request's LoRARequest, before anything is queued: LoRA enabled,
one adapter per id, and the adapter directory read and checked against the model (rank, target
modules, shapes, a damaged file) once per id. ValueError naming the field otherwise."""

from __future__ import annotations

from compiled_llm.lora.peft import load_peft_adapter, lora_module_shapes
from compiled_llm.lora.request import LoRARequest


class LoRARegistry:
    """The adapters requests have named so far (lora_int_id -> LoRARequest), each checked."""

    def __init__(self, enabled: bool, max_lora_rank: int, model_config) -> None:
        self.enabled, self.max_lora_rank = enabled, max_lora_rank
        self.model_config = model_config
        self.adapters: dict[int, LoRARequest] = {}

    def check(self, lora: object) -> LoRARequest | None:
        """lora (None: the base model) once it is known to load; ValueError naming the field."""
        if lora is None:
            return None
        if not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(lora).__name__}")
        if not self.enabled:
            raise ValueError("lora_request: LoRA is not enabled (start the engine with "
                             "enable_lora=True, or --enable-lora)")
        known = self.adapters.get(lora.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (lora.lora_name, lora.lora_path):
                raise ValueError(f"lora_request.lora_int_id {lora.lora_int_id} already names "
                                 f"adapter {known.lora_name!r} at {known.lora_path!r}")
            return known
        if getattr(self.model_config, "moe", None) is not None:
            raise ValueError("lora_request: mixture-of-experts models take no LoRA adapters")
        load_peft_adapter(lora.lora_path, lora_module_shapes(self.model_config),
                          self.max_lora_rank)
        self.adapters[lora.lora_int_id] = lora
        return lora

    def forget(self, lora_int_id: int) -> None:
        """Drop an adapter the server unloaded (the server never reuses its ids)."""
        self.adapters.pop(lora_int_id, None)
