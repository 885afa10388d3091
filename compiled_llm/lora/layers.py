"""The load-time LoRA transform: each targeted projection (a RowSliceLinear view of a fused
q/k/v or gate/up weight included) is wrapped so that it returns base(x) plus its adapter delta
per token, from the slot pool's stacked A/B and the step's per-token slot buffer. The model's
files are unchanged; the fused base matmul stays one GEMM."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.lora.ops import expand_block_n, lora_delta
from compiled_llm.models.layers import SIBLINGS


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


class LoRAGroup(nn.Module):
    """The slot rows of sibling projections that read one input (q/k/v, gate/up; or one
    projection alone): lora_a [S, G*R, K] (member j's ranks at rows jR:(j+1)R), lora_b [S, N, R]
    (member j's columns up to slice_ends[j]; the scaling folded in). Zero where a slot is empty
    or its adapter skips a member or has a lower rank."""

    def __init__(self, in_features: int, widths: list[int], num_slots: int, rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.rank, self.slice_ends = rank, [sum(widths[:j + 1]) for j in range(len(widths))]
        kwargs = {"dtype": dtype, "device": device}
        self.register_buffer("lora_a", torch.zeros(num_slots, rank * len(widths), in_features,
                                                   **kwargs), persistent=False)
        self.register_buffer("lora_b", torch.zeros(num_slots, self.slice_ends[-1], rank,
                                                   **kwargs), persistent=False)

    def columns(self, member: int) -> tuple[int, int]:
        """Member's columns [start, end) of the group's delta."""
        return (self.slice_ends[member - 1] if member else 0), self.slice_ends[member]


class LoRALinear(nn.Module):
    """base(x) + (x A_slot^T) B_slot^T per token: member `member` of a LoRAGroup, whose delta
    is computed once for all its members (one graph node after duplicate elimination)."""

    def __init__(self, base: nn.Module, meta: LoRAStepMeta, group: LoRAGroup,
                 member: int) -> None:
        super().__init__()
        self.base, self.member = base, member
        self.in_features, self.out_features = base.in_features, base.out_features
        self.start, self.end = group.columns(member)
        self.grouped = len(group.slice_ends) > 1
        ranks = slice(member * group.rank, (member + 1) * group.rank)
        # unregistered: the parent owns the group, so Dynamo lifts its tensors once
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "meta", meta)  # owned by the model root, lifted once
        object.__setattr__(self, "lora_a", group.lora_a[:, ranks])  # [S, R, K] view
        object.__setattr__(self, "lora_b", group.lora_b[:, self.start:self.end])  # [S, N, R]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        y = self.base(x)
        group = self.group
        delta = lora_delta(x, group.lora_a, group.lora_b, self.meta.data, group.slice_ends)
        if self.grouped:
            delta = delta[:, self.start:self.end]
        return y + delta.to(y.dtype)

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


def _adapter_dtype(base: nn.Module) -> torch.dtype:
    weight = base.weight
    if not weight.dtype.is_floating_point or weight.element_size() < 2:
        return torch.bfloat16  # quantized base weights: adapters in bf16
    return weight.dtype


def _groups(names: list[str]) -> list[list[str]]:
    """names in groups of siblings that read one input (fuse_weights.SIBLINGS), else alone."""
    grouped, groups = set(), []
    for name in names:
        parent, _, child = name.rpartition(".")
        rule = SIBLINGS.get(parent.rpartition(".")[2])
        if rule is None or child not in rule[1] or name in grouped:
            continue
        members = [f"{parent}.{sibling}" for sibling in rule[1] if f"{parent}.{sibling}" in names]
        if len(members) > 1:
            groups.append(members)
            grouped.update(members)
    return groups + [[name] for name in names if name not in grouped]


def _fits_one_group(bases: list[nn.Module]) -> bool:
    widths = [base.out_features for base in bases]
    same_input = len({base.in_features for base in bases}) == 1
    same_dtype = len({_adapter_dtype(base) for base in bases}) == 1
    return same_input and same_dtype and len(bases) <= 3 and expand_block_n(
        [sum(widths[:j + 1]) for j in range(len(widths))]) > 0


def _wrap_group(model: nn.Module, names: list[str], meta: LoRAStepMeta, num_slots: int,
                rank: int) -> dict[str, LoRALinear]:
    parents, bases = [], []
    for name in names:
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name)
            bases.append(getattr(parent, child))
        except AttributeError:
            raise ValueError(f"enable_lora: {type(model).__name__} has no module {name!r} "
                             "(LoRA serves the Llama family's projections)") from None
        parents.append((parent, child))
    if len(names) > 1 and not _fits_one_group(bases):
        wrapped = {}
        for name in names:
            wrapped.update(_wrap_group(model, [name], meta, num_slots, rank))
        return wrapped
    group = LoRAGroup(bases[0].in_features, [base.out_features for base in bases], num_slots,
                      rank, _adapter_dtype(bases[0]), meta.data.device)
    parents[0][0].add_module(f"lora_group_{parents[0][1]}", group)
    wrapped = {}
    for member, (name, base, (parent, child)) in enumerate(zip(names, bases, parents)):
        wrapped[name] = LoRALinear(base, meta, group, member)
        setattr(parent, child, wrapped[name])
    return wrapped


def wrap_lora_modules(model: nn.Module, names: list[str], num_slots: int, rank: int,
                      max_tokens: int) -> dict[str, LoRALinear]:
    """Swap each named projection of model for a LoRALinear over it, siblings that read one
    input sharing one LoRAGroup; the step buffer is registered on the model as `lora_meta`.
    Returns the wrappers by module name."""
    device = next(model.parameters()).device
    meta = LoRAStepMeta(max_tokens, num_slots, device)
    model.add_module("lora_meta", meta)
    wrapped = {}
    for group in _groups(names):
        wrapped.update(_wrap_group(model, group, meta, num_slots, rank))
    return wrapped
