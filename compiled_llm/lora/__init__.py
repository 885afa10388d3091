"""LoRA adapters: the request type, the engine settings, PEFT loading, the device slot pool and
the batched LoRA op (Triton shrink/expand on CUDA, a torch reference elsewhere)."""
