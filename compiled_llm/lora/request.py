"""LoRARequest: which adapter a prompt runs with, as vLLM spells it (pure Python: it travels
with the request to the engine core and into the prefix-cache hash)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter directory (a str, or a path object kept as its str) under a name and a
    unique positive integer id. Invariant: one id names one adapter for the engine's life (the
    id keys the slot pool and the KV cache)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lora_path, os.PathLike):  # vLLM takes a pathlib.Path as well
            object.__setattr__(self, "lora_path", os.fspath(self.lora_path))
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty str, got {self.lora_name!r}")
        if (isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int)
                or self.lora_int_id < 1):
            raise ValueError(f"lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a non-empty str, got {self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        """The id (vLLM's alias)."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """The name (vLLM's alias)."""
        return self.lora_name

    @property
    def path(self) -> str:
        """The adapter directory (vLLM's alias)."""
        return self.lora_path
