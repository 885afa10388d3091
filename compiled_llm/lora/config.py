"""The EngineArgs fields of LoRA serving, as vLLM spells them (pure Python; EngineArgs inherits
them, so LLM(...) and the `compiled-llm` flags take them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRAArgs:
    """enable_lora, max_loras, max_lora_rank, max_cpu_loras, fully_sharded_loras, lora_dtype."""

    enable_lora: bool = False
    """Serve LoRA adapters: requests name one with a LoRARequest (the server: --lora-modules and
    a request's model)."""
    max_loras: int = 1
    """Adapters one step may run, the device slot pool's size (others are paged in, LRU)."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted (the slots are sized for it)."""
    max_cpu_loras: int | None = None
    """Adapters kept loaded in host memory, so paging one back into a slot reads no file
    (default: max_loras; at least max_loras)."""
    fully_sharded_loras: bool = False
    """vLLM's choice of how tensor parallel ranks split the adapters' weights. Accepted for
    vLLM compatibility; it changes nothing here (the output does not depend on it)."""
    lora_dtype: str = "auto"
    """The adapters' dtype: auto, the model's (vLLM's default); adapters always run in the
    model's dtype, so only auto or the dtype given as dtype is accepted."""

    def check_lora(self) -> None:
        """ValueError naming the first LoRA field out of range."""
        for name, value in (("max_loras", self.max_loras),
                            ("max_lora_rank", self.max_lora_rank),
                            ("max_cpu_loras", self.max_cpu_loras)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras})")
        for name in ("enable_lora", "fully_sharded_loras"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        # vLLM takes a torch.dtype too: compared by its name
        if str(self.lora_dtype).removeprefix("torch.") not in ("auto", getattr(self, "dtype",
                                                                                "auto")):
            raise ValueError(f"lora_dtype: adapters run in the model's dtype; only 'auto' (or "
                             f"dtype's own value) is supported, got {self.lora_dtype!r}")
        if self.max_lora_rank > 512:
            raise ValueError(f"max_lora_rank must be <= 512, got {self.max_lora_rank}")
