"""Triton kernels of the batched LoRA op: shrink (x A^T) and expand (y + h B^T) over tokens
grouped by adapter slot, punica's segmented layout."""

from compiled_llm.lora.kernels.shrink_expand import (
    kernels_interpreted,
    lora_expand,
    lora_shrink,
)

__all__ = ["kernels_interpreted", "lora_expand", "lora_shrink"]
