"""Tensor parallelism over quantized checkpoints: the TP plan's slice of a linear's `.weight`
becomes a slice of each tensor the format stores, in that tensor's own layout (packed, grouped
or block dims; scales of one value read whole; act order's split inputs in padded groups),
row-parallel quantized linears all-reduce; `quantization="fp8"` quantizes each rank's shards;
block-FP8 experts read their 128-blocks' scales. Checked on meta models before ranks start."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from compiled_llm.distributed.expert_parallel import expert_parallel_names
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.shards import FusedShard, Shard, ZeroShard
from compiled_llm.distributed.tensor_parallel import parameters_on_meta, shard_model
from compiled_llm.distributed.tp_layers import RowParallelLinear, reduced_class
from compiled_llm.quantization.compressed_tensors import BLOCK, CompressedTensorsFormat
from compiled_llm.quantization.formats import (
    AwqFormat,
    BlockFp8Format,
    GptqFormat,
    PerTensorFp8Format,
)
from compiled_llm.quantization.loading import checkpoint_shapes, detect_format, prepare_quantized
from compiled_llm.quantization.packing import unpack_int4
from compiled_llm.quantization.registry import QuantFormat
from compiled_llm.quantization.w4a16 import w4a16_linear

PACK = 8  # 4-bit values per int32 word


@dataclass(frozen=True)
class Axes:
    """Where a stored tensor keeps a linear's outputs (`n`) and inputs (`k`): (dim, how many
    features one index covers), None where it is whole on every rank; `ceil`: its last index
    may cover a partial unit (128x128 blocks, zero points packed along N)."""

    n: tuple[int, int] | None
    k: tuple[int, int] | None
    ceil: bool = False


def _group(dim: int, group_size: int) -> tuple[int, int] | None:
    # one group per row (group_size -1): the scales hold every input, whole on each rank
    return None if group_size == -1 else (dim, group_size)


def stored_layout(fmt: QuantFormat) -> dict[str, Axes]:
    """Each stored tensor's Axes for the format; ValueError for one not sharded."""
    if isinstance(fmt, GptqFormat):  # qweight [K/8, N], qzeros [K/g, N/8], scales [K/g, N]
        group = _group(0, fmt.group_size)
        return {"qweight": Axes((1, 1), (0, PACK)), "qzeros": Axes((1, PACK), group),
                "scales": Axes((1, 1), group), "g_idx": Axes(None, (0, 1))}
    if isinstance(fmt, AwqFormat):  # qweight [K, N/8], qzeros [K/g, N/8], scales [K/g, N]
        return {"qweight": Axes((1, PACK), (0, 1)),
                "qzeros": Axes((1, PACK), _group(0, fmt.group_size)),
                "scales": Axes((1, 1), _group(0, fmt.group_size))}
    if isinstance(fmt, CompressedTensorsFormat) and fmt.scheme == "w4a16":
        group = _group(1, fmt.group_size)  # weight_packed [N, K/8], weight_scale [N, K/g]
        return {"weight_packed": Axes((0, 1), (1, PACK)), "weight_scale": Axes((0, 1), group),
                "weight_zero_point": Axes((0, PACK), group, ceil=True),  # [ceil(N/8), K/g]
                "weight_g_idx": Axes(None, (0, 1)), "weight_shape": Axes(None, None)}
    block = Axes((0, BLOCK[0]), (1, BLOCK[1]), ceil=True)  # [ceil(N/128), K/128]
    if isinstance(fmt, BlockFp8Format):
        return {"weight": Axes((0, 1), (1, 1)), "weight_scale_inv": block}
    if isinstance(fmt, CompressedTensorsFormat | PerTensorFp8Format):
        strategy = getattr(fmt, "weight_strategy", "tensor")
        scale = {"channel": Axes((0, 1), None), "tensor": Axes(None, None)}.get(strategy, block)
        return {"weight": Axes((0, 1), (1, 1)), "weight_scale": scale,
                "input_scale": Axes(None, None), "input_zero_point": Axes(None, None)}
    raise ValueError(f"{fmt.name} checkpoint: tensor_parallel_size > 1 is not supported for "
                     "this format (run it with 1)")


def _translate(shard: Shard, axis: tuple[int, int], ceil: bool, full: int,
               where: str) -> Shard:
    """Features [start, start + size) as indices of a stored dim of `axis` (dim, unit);
    ValueError naming tensor_parallel_size where they do not fall on whole units (a partial
    last unit only at the tensor's end when `ceil`)."""
    dim, unit = axis
    end = shard.start + shard.size
    if shard.start % unit or (end % unit and not (ceil and end == full)):
        raise ValueError(f"{where}: features [{shard.start}, {end}) of this rank do not fall "
                         f"on whole units of {unit} (the format's packing, group_size or "
                         "block); choose a tensor_parallel_size that splits them so")
    return Shard(dim, shard.start // unit, -(-end // unit) - shard.start // unit)


def _full_size(layout: dict[str, Axes], stored: dict[str, tuple[int, ...]], prefix: str,
               which: str) -> int:
    """A linear's full feature count along `which` ("n" or "k"), read off a stored tensor
    whose units along it are whole (not `ceil`)."""
    for name, axes in layout.items():
        axis = getattr(axes, which)
        if axis is not None and not axes.ceil and f"{prefix}.{name}" in stored:
            return stored[f"{prefix}.{name}"][axis[0]] * axis[1]
    return -1


def shard_stored(model: nn.Module, plan: dict, fmt: QuantFormat,
                 stored: dict[str, tuple[int, ...]], tp: TPGroup,
                 linears: list[str]) -> None:
    """Replace, for each of `linears` (CheckpointLinears by now), the plan of its `.weight`
    with one per stored tensor in that tensor's layout: rows (column parallel: one Shard or a
    fused tensor's parts) slice `n`, columns (row parallel) slice `k`. A row-parallel bias is
    read on rank 0 alone, as the all-reduce sums the ranks' outputs."""
    layout = stored_layout(fmt)
    world = f"tensor_parallel_size {tp.world_size}: {fmt.name} checkpoint"
    for prefix in linears:
        shard = plan.pop(f"{prefix}.weight", None)
        if shard is None:
            continue  # replicated: every stored tensor read whole
        parts = shard.parts if isinstance(shard, FusedShard) else (shard,)
        which = "k" if parts[0].dim == 1 else "n"
        full = _full_size(layout, stored, prefix, which)
        for name, axes in layout.items():
            axis = getattr(axes, which)
            if axis is None or f"{prefix}.{name}" not in stored:
                continue
            where = f"{world}, {prefix}.{name}"
            pieces = tuple(_translate(part, axis, axes.ceil, full, where) for part in parts)
            plan[f"{prefix}.{name}"] = FusedShard(pieces) if isinstance(shard, FusedShard) \
                else pieces[0]
        if which == "k" and tp.rank and model.get_submodule(prefix).bias is not None:
            plan[f"{prefix}.bias"] = ZeroShard()


def shard_expert_scales(model: nn.Module, plan: dict, tp: TPGroup,
                        whole: Collection[str] = ()) -> None:
    """Block-FP8 experts read the rows / columns of their block scales that cover the
    intermediate features their weights' plan slices (whole 128-blocks: checked); those
    named in `whole` (expert parallel) read their scales' experts as their weights'."""
    from compiled_llm.quantization.moe_fp8 import SCALE_SUFFIX, Fp8FusedMoE

    for name, experts in model.named_modules():
        if not isinstance(experts, Fp8FusedMoE):
            continue
        for param in ("w13_weight", "w2_weight"):
            shard = plan.get(f"{name}.{param}")  # None: per-expert tensors, read whole
            if shard is not None and name in whole:  # stacked: the same experts on dim 0
                plan[f"{name}.{param}{SCALE_SUFFIX}"] = shard
            if shard is None or name in whole:
                continue
            parts = shard.parts if isinstance(shard, FusedShard) else (shard,)
            where = f"tensor_parallel_size {tp.world_size}: {name}.{param}{SCALE_SUFFIX}"
            pieces = tuple(_translate(part, (part.dim, BLOCK[0]), False, -1, where)
                           for part in parts)
            plan[f"{name}.{param}{SCALE_SUFFIX}"] = FusedShard(pieces) if isinstance(
                shard, FusedShard) else pieces[0]


GROUPED = {"qzeros", "scales", "weight_scale", "weight_zero_point"}  # [.., K/g, ..] tensors


def _act_order_rows(model: nn.Module, plan: dict, linears: list[str],
                    stored: dict[str, tuple[int, ...]]) -> list[str]:
    """The linears with activation order whose inputs are split (their g_idx sliced): a
    rank's inputs then fall in groups of any size, so each reads its scales and zeros whole
    (resized to the stored groups) and is converted by act_order_shard; their names."""
    split = []
    for prefix in linears:
        if f"{prefix}.g_idx" not in plan and f"{prefix}.weight_g_idx" not in plan:
            continue
        linear = model.get_submodule(prefix)
        for name in GROUPED & set(linear._parameters):
            plan.pop(f"{prefix}.{name}", None)
            param = linear._parameters[name]
            linear._parameters[name] = nn.Parameter(torch.empty(
                stored[f"{prefix}.{name}"], dtype=param.dtype, device=param.device),
                requires_grad=False)
        split.append(prefix)
    return split


def act_order_shard(linear: nn.Module) -> nn.Module:
    """A W4A16Linear over a rank's inputs of an act-order linear: its inputs sorted by group,
    each used group padded to group_size slots whose values equal the zero point (weight 0,
    read from input 0), so groups stay whole for the kernels; in_features stays the rank's."""
    fmt, t = linear.fmt, {name: p.data for name, p in linear._parameters.items()}
    if isinstance(fmt, GptqFormat):
        values = unpack_int4(t["qweight"].t().contiguous())  # [N, K]
        zeros = unpack_int4(t["qzeros"]).t() + fmt.zero_offset  # [N, G]
        scales, g_idx = t["scales"].t(), t["g_idx"].long()
    else:  # compressed-tensors W4A16: zeros offset by 8 like the values
        values, scales, g_idx = unpack_int4(t["weight_packed"]), t["weight_scale"], \
            t["weight_g_idx"].long()
        zeros = (torch.full(scales.shape, 8, dtype=torch.uint8, device=scales.device)
                 if "weight_zero_point" not in t else
                 unpack_int4(t["weight_zero_point"].t().contiguous()).t()[: values.shape[0]])
    group, order = fmt.group_size, torch.argsort(g_idx, stable=True)
    used, counts = torch.unique(g_idx, return_counts=True)  # sorted groups of this rank
    first = torch.cumsum(counts, 0) - counts  # each used group's first sorted input
    which = torch.repeat_interleave(torch.arange(used.numel(), device=g_idx.device), counts)
    slots = which * group + torch.arange(g_idx.numel(), device=g_idx.device) - first[which]
    perm = torch.zeros(used.numel() * group, dtype=torch.long, device=g_idx.device)
    perm[slots] = order
    padded = zeros[:, used].to(torch.uint8).repeat_interleave(group, dim=1)
    padded[:, slots] = values[:, order]
    out = w4a16_linear(padded, scales[:, used], zeros[:, used], perm, linear.bias, group,
                       linear.dtype)
    out.in_features = values.shape[1]
    return out


def prepare_sharded(model: nn.Module, fmt: QuantFormat, files: list[Path], plan: dict,
                    tp: TPGroup, act_order: bool = False) -> Callable[[], nn.Module]:
    """prepare_quantized on a sharded model (its linears already per-rank size): the plan is
    rewritten for the stored tensors; the returned step converts them, fixes what holds the
    full shape or group numbers, and makes the row-parallel ones all-reduce."""
    stored = checkpoint_shapes(files)
    rows = {name: module.group_name for name, module in model.named_modules()
            if type(module) is RowParallelLinear and f"{name}.{fmt.marker}" in stored}
    for name in rows:  # a plain linear for prepare_quantized to swap
        model.get_submodule(name).__class__ = nn.Linear
    whole_experts = expert_parallel_names(model)
    try:
        finalize = prepare_quantized(model, fmt, files)
    except ValueError as error:  # a rank's share of inputs in partial groups or blocks
        raise ValueError(f"tensor_parallel_size {tp.world_size} (a rank's share of each "
                         f"linear): {error}") from None
    linears = [name for name, module in model.named_modules() if hasattr(module, "fmt")]
    shard_stored(model, plan, fmt, stored, tp, linears)
    shard_expert_scales(model, plan, tp, whole_experts)
    split = _act_order_rows(model, plan, linears, stored) if act_order else []

    def sharded_finalize() -> nn.Module:
        for name in linears:
            linear = model.get_submodule(name)
            if name in split:  # loading's finalize calls it
                linear.convert = functools.partial(act_order_shard, linear)
            else:
                _local_fixups(linear)
        finalize()
        for name, group_name in rows.items():
            module = model.get_submodule(name)
            module.__class__ = reduced_class(type(module))
            module.group_name = group_name
        return model

    return sharded_finalize


def _local_fixups(linear: nn.Module) -> None:
    """A shard's tensors that still describe the whole linear: compressed-tensors'
    weight_shape becomes this rank's [N, K]; a row shard's g_idx (groups in order) counts
    from its first group (a whole one's least group is 0 already)."""
    with torch.no_grad():
        if hasattr(linear, "weight_shape"):
            linear.weight_shape.copy_(torch.tensor([linear.out_features, linear.in_features]))
        for name in ("g_idx", "weight_g_idx"):
            g_idx = getattr(linear, name, None)
            if g_idx is not None and g_idx.numel():
                g_idx.sub_(g_idx.min())


def quantize_row_parallel(model: nn.Module, tp: TPGroup) -> None:
    """quantization="fp8" on a sharded model: each row-parallel linear becomes an Fp8Linear of
    its columns whose output is all-reduced (its bias kept on rank 0 alone, so it is added
    once); quantize_model then takes the plain linears."""
    from compiled_llm.quantization.fp8 import Fp8Linear

    for name, module in list(model.named_modules()):
        if type(module) is not RowParallelLinear:
            continue
        fp8 = Fp8Linear(module)
        if tp.rank and fp8.bias is not None:
            fp8.bias = nn.Parameter(torch.zeros_like(fp8.bias), requires_grad=False)
        fp8.__class__ = reduced_class(Fp8Linear)
        fp8.group_name = module.group_name
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, fp8)


def act_order(hf_config: dict) -> bool:
    """Whether the checkpoint's quantization_config asks for activation order (GPTQ desc_act,
    compressed-tensors actorder group / dynamic)."""
    config = hf_config.get("quantization_config") or {}
    groups = config.get("config_groups") or {}
    orders = [(group.get("weights") or {}).get("actorder") for group in groups.values()]
    return bool(config.get("desc_act")) or any(o in ("group", "dynamic") for o in orders)


def _check_quantized_moe(config, fmt: QuantFormat | None, what: str, world: int,
                         expert_parallel: bool) -> None:
    """Block-FP8 experts (stored so, or quantization="fp8") split by their intermediate
    features in whole 128-blocks; ValueError naming the field for any other case."""
    from compiled_llm.quantization.moe_fp8 import check_block_shape

    if fmt is not None and not isinstance(fmt, BlockFp8Format):
        raise ValueError(f"tensor_parallel_size {world}: a mixture-of-experts model with a "
                         f"{what} is not sharded yet (run it with tensor_parallel_size 1)")
    share = 1 if expert_parallel else world  # whole experts, or intermediate features split
    try:
        check_block_shape(config.hidden_size, config.moe.moe_intermediate_size // share)
    except ValueError as error:
        raise ValueError(f"tensor_parallel_size {world} (a rank's share of each expert): "
                         f"{error}") from None


def check_quantized_tp(model_cls: type[nn.Module], config, hf_config: dict, files_of,
                       world: int, quantization: str | None,
                       expert_parallel: bool = False) -> None:
    """ValueError naming tensor_parallel_size, before any rank starts, where `world` ranks
    cannot split the quantized checkpoint (or `quantization`): every rank's shard is planned
    on a meta model. `files_of()` lists the checkpoint files."""
    fmt = detect_format(hf_config, quantization)
    what = fmt.name + " checkpoint" if fmt is not None else f"quantization={quantization!r}"
    if fmt is None and quantization is None:
        return
    if getattr(config, "moe", None) is not None:
        _check_quantized_moe(config, fmt, what, world, expert_parallel)
    if fmt is None:
        return  # fp8 at load: per-row scales of each shard, any split (experts: checked)
    if fmt.dequantizes_at_load:
        raise ValueError(f"tensor_parallel_size {world} with a {what} is not supported yet")
    files = files_of()
    for rank in range(world):
        tp = TPGroup(rank, world, "check", None, None)  # no collective runs
        with parameters_on_meta():
            model = model_cls(config, max_len=16)
        plan = shard_model(model, tp, expert_parallel)
        prepare_sharded(model, fmt, files, plan, tp, act_order(hf_config))
