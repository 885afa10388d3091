"""The front end's check of a request's LoRARequest, before anything is queued: LoRA enabled,
one adapter per id, and the adapter directory read and checked against the model (rank, target
modules, shapes, a damaged file) once per id. ValueError naming the field otherwise. It is also
the engine's adapter list: add_lora, remove_lora and list_loras (vLLM's) act on it."""

from __future__ import annotations

from compiled_llm.lora.peft import load_peft_adapter, lora_module_shapes
from compiled_llm.lora.request import LoRARequest


class LoRARegistry:
    """The adapters added or named by requests so far (lora_int_id -> LoRARequest), each
    checked. Invariant: one id names one adapter for the engine's life (it keys the worker's
    slots and the KV cache), so a removed id comes back only with the adapter it named, as
    vLLM re-adds a removed adapter that a request or add_lora names again."""

    def __init__(self, enabled: bool, max_lora_rank: int, model_config) -> None:
        self.enabled, self.max_lora_rank = enabled, max_lora_rank
        self.model_config = model_config
        self.adapters: dict[int, LoRARequest] = {}
        self.removed: dict[int, LoRARequest] = {}  # removed id -> the adapter it named

    def check(self, lora: object) -> LoRARequest | None:
        """lora (None: the base model) once it is known to load; ValueError naming the field."""
        if lora is None:
            return None
        if not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(lora).__name__}")
        if not self.enabled:
            raise ValueError("lora_request: LoRA is not enabled (start the engine with "
                             "enable_lora=True, or --enable-lora)")
        known = self.adapters.get(lora.lora_int_id) or self.removed.get(lora.lora_int_id)
        if known is not None and (known.lora_name, known.lora_path) != (lora.lora_name,
                                                                        lora.lora_path):
            raise ValueError(f"lora_request.lora_int_id {lora.lora_int_id} already names "
                             f"adapter {known.lora_name!r} at {known.lora_path!r}")
        if lora.lora_int_id in self.adapters:
            return known
        if getattr(self.model_config, "moe", None) is not None:
            raise ValueError("lora_request: mixture-of-experts models take no LoRA adapters")
        load_peft_adapter(lora.lora_path, lora_module_shapes(self.model_config),
                          self.max_lora_rank)
        self.adapters[lora.lora_int_id] = lora
        self.removed.pop(lora.lora_int_id, None)
        return lora

    def add(self, lora: object) -> bool:
        """check for add_lora, where None (no adapter) is refused too; True once added."""
        if lora is None:
            raise ValueError("lora_request must be a LoRARequest, got None")
        self.check(lora)
        return True

    def forget(self, lora_int_id: int) -> None:
        """Drop an adapter the server unloaded (the server never reuses its ids)."""
        self.adapters.pop(lora_int_id, None)

    def remove(self, lora_int_id: int) -> bool:
        """Drop an added adapter, its id kept for that adapter alone (see the invariant);
        False if absent."""
        lora = self.adapters.pop(lora_int_id, None)
        if lora is None:
            return False
        self.removed[lora_int_id] = lora
        return True
