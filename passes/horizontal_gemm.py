"""HorizontalGemmFusionPass: matmuls that read one activation and adjacent row slices of one
weight (the fused layout of worker/fuse_weights.py) -> one mm/addmm over the rows they cover,
whose users read column slices (views) of its output. The quantized gemm ops of ROW_SLICED_GEMMS
(FP8, INT8, W4A16, block FP8) that read one activation fuse the same way, over row slices of
their weight, scales (and zeros).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch.fx import Graph, Node

from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import insert_op, val

aten = torch.ops.aten
# compiled_llm op -> (args read as row slices, the first the weight; the bias arg); every other
# arg (activation, its scales, an input permutation, options) must be the same node to fuse.
# A row-sliced arg after the weight may be None (absent) when it is in every sibling.
ROW_SLICED_GEMMS: dict[str, tuple[tuple[int, ...], int]] = {
    "fp8_gemm": ((2, 3), 4),
    "int8_gemm": ((2, 3), 4),
    "w4a16_gemm": ((1, 2, 3, 7, 8), 5),  # 7, 8: the optional tinygemm weight, scales_zeros
    "fp8_block_gemm": ((1, 2), 3),
}
# pure activation-quant ops: siblings each quantize the one input; merged first so that their
# gemms read one node (the FP8 per-token op is merged by the norm + quant passes already)
SHARED_QUANT_OPS = ("quant_int8_per_token", "quant_fp8_static")


class RowSlice(NamedTuple):
    """Rows [start, end) of base, read along dim 0."""

    base: Node
    start: int
    end: int


class Gemm(NamedTuple):
    """One mm/addmm site, x @ weight_rows^T (+ bias_rows); for a ROW_SLICED_GEMMS op, x is its
    other args and scales the weight's other row-sliced tensors (scales, zeros)."""

    node: Node
    x: Node | tuple
    weight: RowSlice
    bias: RowSlice | None
    scales: tuple[RowSlice, ...] | None = None

    def key(self) -> tuple:
        """What gemms must share to fuse: the activation and every base tensor."""
        return (self.node.target, self.x, self.weight.base,
                None if self.bias is None else self.bias.base,
                *(None if part is None else part.base for part in self.scales or ()))


def _row_slice(node) -> RowSlice | None:
    """slice(base, 0, start, end[, 1]) with int bounds inside base -> RowSlice."""
    if not isinstance(node, Node) or node.target is not aten.slice.Tensor:
        return None
    base, dim, start, end, *step = (*node.args, *([None] * (4 - len(node.args))))
    base_val, out = val(base), val(node)
    if base_val is None or out is None or dim != 0 or step not in ([], [1]):
        return None
    if not isinstance(start, int) or not isinstance(end, int) or start < 0:
        return None
    # end may be past the base (slice clamps); the output's row count is what is read
    rows = out.shape[0]
    return RowSlice(base, start, start + rows) if isinstance(rows, int) else None


def _same_rows(part: RowSlice | None, weight: RowSlice) -> bool:
    return part is not None and part[1:] == weight[1:]


def _sliced_op(node: Node) -> tuple[tuple[int, ...], int] | None:
    """ROW_SLICED_GEMMS' entry for node's target, if it is one of those ops."""
    namespace = getattr(torch.ops, "compiled_llm", None)
    for name, spec in ROW_SLICED_GEMMS.items():
        op = getattr(namespace, name, None) if namespace is not None else None
        if op is not None and node.target is op.default:
            return spec
    return None


def _sliced_gemm(node: Node, spec: tuple[tuple[int, ...], int]) -> Gemm | None:
    """Decode op(..., slice(W), slice(scale) ..., slice(b) | None, ...) by its spec."""
    sliced, bias_at = spec
    args = [node.args[i] if i < len(node.args) else None for i in sliced]
    rows = [None if arg is None else _row_slice(arg) for arg in args]
    if rows[0] is None or not all(arg is None or _same_rows(part, rows[0])
                                  for arg, part in zip(args[1:], rows[1:])):
        return None
    bias = node.args[bias_at]
    bias_rows = None if bias is None else _row_slice(bias)
    if bias is not None and not _same_rows(bias_rows, rows[0]):
        return None
    others = tuple(arg for i, arg in enumerate(node.args) if i not in sliced and i != bias_at)
    return Gemm(node, others, rows[0], bias_rows, tuple(rows[1:]))


def _gemm(node: Node) -> Gemm | None:
    """Decode mm(x, permute(slice(W), [1, 0])) or addmm(slice(b), x, permute(slice(W)))."""
    spec = _sliced_op(node)
    if spec is not None:
        return _sliced_gemm(node, spec) if not node.kwargs else None
    if node.target is aten.mm.default and len(node.args) == 2:
        bias, (x, w_t) = None, node.args
    elif node.target is aten.addmm.default and len(node.args) == 3 and not node.kwargs:
        bias, x, w_t = node.args
    else:
        return None
    if not (isinstance(w_t, Node) and w_t.target is aten.permute.default
            and list(w_t.args[1]) == [1, 0]):
        return None
    weight = _row_slice(w_t.args[0])
    if weight is None or val(weight.base) is None or val(weight.base).dim() != 2:
        return None
    bias_rows = None if bias is None else _row_slice(bias)
    if bias is not None and not _same_rows(bias_rows, weight):
        return None
    return Gemm(node, x, weight, bias_rows)


def _runs(gemms: list[Gemm]) -> list[list[Gemm]]:
    """Maximal runs (2 or more) of gemms whose weight rows chain contiguously."""
    ordered = sorted(gemms, key=lambda g: g.weight.start)
    runs, current = [], [ordered[0]]
    for gemm in ordered[1:]:
        if gemm.weight.start == current[-1].weight.end:
            current.append(gemm)
        else:
            runs.append(current)
            current = [gemm]
    runs.append(current)
    return [run for run in runs if len(run) > 1]


def _merge_shared_quant(graph: Graph) -> None:
    """Merge identical SHARED_QUANT_OPS calls (and getitems of them) into the first one."""
    namespace = getattr(torch.ops, "compiled_llm", None)
    targets = {getattr(namespace, name).default for name in SHARED_QUANT_OPS
               if namespace is not None and hasattr(namespace, name)}
    seen: dict[tuple, Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        is_quant_item = node.target is operator.getitem and isinstance(node.args[0], Node) \
            and node.args[0].target in targets
        if node.target not in targets and not is_quant_item:
            continue
        first = seen.setdefault((node.target, node.args), node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)


class HorizontalGemmFusionPass(GraphPass):
    """Groups gemms by (activation, weight base, bias base) and fuses each contiguous run."""

    flag = "enable_horizontal_gemm"

    def apply(self, graph: Graph) -> int:
        """Fuse every run; returns the number of fused matmuls created."""
        _merge_shared_quant(graph)
        groups: dict[tuple, list[Gemm]] = {}
        for node in graph.nodes:
            gemm = _gemm(node) if node.op == "call_function" else None
            if gemm is not None:
                groups.setdefault(gemm.key(), []).append(gemm)
        fused = 0
        for gemms in groups.values():
            for run in _runs(gemms) if len(gemms) > 1 else []:
                self._fuse(graph, run)
                fused += 1
        return fused

    def _fuse(self, graph: Graph, run: list[Gemm]) -> None:
        order = {node: i for i, node in enumerate(graph.nodes)}
        first = min((g.node for g in run), key=order.__getitem__)
        start, end = run[0].weight.start, run[-1].weight.end
        out = self._fused_gemm(graph, first, run[0], start, end)
        parts = [insert_op(graph, first, aten.slice.Tensor,
                           (out, 1, g.weight.start - start, g.weight.end - start), 1)[0]
                 for g in run]
        for gemm, part in zip(run, parts):  # erase only now: `first` anchors the inserts
            gemm.node.replace_all_uses_with(part)
            graph.erase_node(gemm.node)

    def _fused_gemm(self, graph: Graph, before: Node, gemm: Gemm, start: int, end: int) -> Node:
        """The one gemm over rows [start, end) of gemm's bases, inserted before `before`."""
        rows = lambda part: None if part is None else self._rows(  # noqa: E731
            graph, before, part.base, start, end)
        weight, bias = rows(gemm.weight), rows(gemm.bias)
        if gemm.scales is not None:  # a ROW_SLICED_GEMMS op: rebuild its args in order
            sliced, bias_at = _sliced_op(gemm.node)
            fused = dict(zip(sliced, (weight, *(rows(part) for part in gemm.scales))))
            # args past the node's own (optional ones left at their default) stay absent
            others = iter(gemm.x)
            args = tuple(fused[i] if i in fused else bias if i == bias_at else next(others)
                         for i in range(len(gemm.node.args)))
            return insert_op(graph, before, gemm.node.target, args, 1)[0]
        (w_t,) = insert_op(graph, before, aten.permute.default, (weight, [1, 0]), 1)
        if bias is None:
            return insert_op(graph, before, aten.mm.default, (gemm.x, w_t), 1)[0]
        return insert_op(graph, before, aten.addmm.default, (bias, gemm.x, w_t), 1)[0]

    @staticmethod
    def _rows(graph: Graph, before: Node, base: Node, start: int, end: int) -> Node:
        """base itself when [start, end) covers it, else a row slice of it."""
        if start == 0 and end == val(base).shape[0]:
            return base
        return insert_op(graph, before, aten.slice.Tensor, (base, 0, start, end), 1)[0]
