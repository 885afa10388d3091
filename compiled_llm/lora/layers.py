"""The load-time LoRA transform: each targeted projection (a RowSliceLinear view of a fused
q/k/v or gate/up weight included) is wrapped so that it returns base(x) plus its adapter delta
per token, from the slot pool's stacked A/B and the step's per-token slot buffer. The model's
files are unchanged; the fused base matmul stays one GEMM."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.lora.ops import lora_add


class LoRAStepMeta(nn.Module):
    """The persistent per-step buffer every wrapped layer reads: token slots [max_tokens]
    (-1: base model), row indices grouped by slot with the base rows last [max_tokens], and
    segment starts [slots + 2].
    One int64 tensor with a fixed address, so CUDA graphs replay with each step's values."""

    def __init__(self, max_tokens: int, num_slots: int, device: torch.device) -> None:
        super().__init__()
        self.max_tokens, self.num_slots = max_tokens, num_slots
        data = torch.full((2 * max_tokens + num_slots + 2,), -1, dtype=torch.int64,
                          device=device)
        data[2 * max_tokens:] = 0  # every segment empty
        self.register_buffer("data", data, persistent=False)


class LoRALinear(nn.Module):
    """base(x) + (x A_slot^T) B_slot^T per token. lora_a [S, R, K] and lora_b [S, N, R] (the
    scaling folded into B) are this layer's rows of the slot pool, zero where a slot is empty
    or its adapter skips this module or has a lower rank."""

    def __init__(self, base: nn.Module, meta: LoRAStepMeta, num_slots: int, rank: int) -> None:
        super().__init__()
        self.base = base
        weight = base.weight
        kwargs = {"dtype": weight.dtype, "device": weight.device}
        if not weight.dtype.is_floating_point or weight.element_size() < 2:
            kwargs["dtype"] = torch.bfloat16  # quantized base weights: adapters in bf16
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_buffer("lora_a", torch.zeros(num_slots, rank, self.in_features, **kwargs),
                             persistent=False)
        self.register_buffer("lora_b", torch.zeros(num_slots, self.out_features, rank, **kwargs),
                             persistent=False)
        object.__setattr__(self, "meta", meta)  # owned by the model root, lifted once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        y = self.base(x)
        delta_in = x if x.dtype == self.lora_a.dtype else x.to(self.lora_a.dtype)
        out = lora_add(delta_in, y.to(self.lora_a.dtype), self.lora_a, self.lora_b,
                       self.meta.data)
        return out.to(y.dtype)

    def set_slot(self, slot: int, weights: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Write one adapter's A and B (None: zeros) into a slot; rows past its rank stay 0."""
        with torch.no_grad():
            self.lora_a[slot].zero_()
            self.lora_b[slot].zero_()
            if weights is not None:
                lora_a, lora_b = weights
                rank = lora_a.shape[0]
                self.lora_a[slot, :rank].copy_(lora_a)
                self.lora_b[slot, :, :rank].copy_(lora_b)


def wrap_lora_modules(model: nn.Module, names: list[str], num_slots: int, rank: int,
                      max_tokens: int) -> dict[str, LoRALinear]:
    """Swap each named projection of model for a LoRALinear over it; the step buffer is
    registered on the model as `lora_meta`. Returns the wrappers by module name."""
    device = next(model.parameters()).device
    meta = LoRAStepMeta(max_tokens, num_slots, device)
    model.add_module("lora_meta", meta)
    wrapped = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name)
            base = getattr(parent, child)
        except AttributeError:
            raise ValueError(f"enable_lora: {type(model).__name__} has no module {name!r} "
                             "(LoRA serves the Llama family's projections)") from None
        wrapper = LoRALinear(base, meta, num_slots, rank)
        setattr(parent, child, wrapper)
        wrapped[name] = wrapper
    return wrapped
