"""NoOpEliminationPass: drops ops that return their input unchanged: same-shape views, reshapes
and expands, identity permutes, whole-dim slices, same-dtype casts, copies of contiguous values,
single-input cats and whole-tensor slice_scatters.

Shapes are compared with `statically_known_true`, so a symbolic T never adds a guard.
"""

from __future__ import annotations

import operator
import sys

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import same_shape, val

aten, prims = torch.ops.aten, torch.ops.prims

_SAME_SHAPE = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
               aten.expand.default, aten.alias.default}
_COPIES = {aten.clone.default, aten._to_copy.default, prims.convert_element_type.default}


def _full_slice(node: Node, src: torch.Tensor) -> bool:
    args = list(node.args[1:])
    dim, start, end, step = args + [0, None, None, 1][len(args):]
    dim = dim % src.dim()
    # a symbolic bound (`x[:T]`) arrives as the node that computes it: compare its SymInt
    if any(isinstance(b, Node) and "val" not in b.meta for b in (start, end)):
        return False
    start, end = (b.meta["val"] if isinstance(b, Node) else b for b in (start, end))
    start_ok = start is None or statically_known_true(start == 0)
    # sys.maxsize is how `x[a:]` spells "to the end"; it must not depend on a symbolic size
    end_ok = end is None or statically_known_true(end >= sys.maxsize) \
        or statically_known_true(end >= src.shape[dim])
    return start_ok and end_ok and step == 1


def _same_layout(lhs: torch.Tensor, rhs: torch.Tensor) -> bool:
    return (lhs.dtype == rhs.dtype and lhs.device == rhs.device and same_shape(lhs, rhs)
            and all(statically_known_true(x == y) for x, y in zip(lhs.stride(), rhs.stride())))


def source_if_noop(node: Node) -> Node | None:
    """The node this one can be replaced by, or None if it does real work."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], (Node, list)):
        return None
    target = node.target
    if target is aten.cat.default:
        src = node.args[0][0] if len(node.args[0]) == 1 else None
    elif target is aten.slice_scatter.default:
        src = node.args[1]
    else:
        src = node.args[0]
    src_val, out_val = val(src), val(node)
    if not isinstance(src_val, torch.Tensor) or not isinstance(out_val, torch.Tensor):
        return None
    if target in _SAME_SHAPE or target is aten.permute.default:
        keep = same_shape(src_val, out_val) and (
            target is not aten.permute.default
            or list(node.args[1]) == list(range(src_val.dim())))
    elif target is aten.slice.Tensor:
        keep = _full_slice(node, src_val)
    elif target in _COPIES or target in (aten.cat.default, aten.slice_scatter.default):
        keep = _same_layout(src_val, out_val)
    else:
        return None
    return src if keep else None


def _written_later(node: Node) -> bool:
    """A user might write into node (a mutating op or anything not a plain ATen op)."""
    for user in node.users:
        if user.op == "output" or user.target is operator.getitem:
            continue
        schema = getattr(user.target, "_schema", None)
        if schema is None or schema.is_mutable:
            return True
    return False


def _aliases_input(src: Node, node: Node) -> bool:
    # a graph output must not become a graph input: callers may write into outputs
    return src.op == "placeholder" and any(user.op == "output" for user in node.users)


class NoOpEliminationPass(GraphPass):
    """Replaces each no-op node by its source (never a graph input that is also an output, nor
    a copy that a later op may write into)."""

    flag = "enable_noop"

    def apply(self, graph: Graph) -> int:
        """Drop every no-op node; returns how many went."""
        removed = 0
        for node in list(graph.nodes):
            src = source_if_noop(node)
            if src is None or _aliases_input(src, node):
                continue
            if node.target in _COPIES and _written_later(node):
                continue
            node.replace_all_uses_with(src)
            graph.erase_node(node)
            removed += 1
        return removed
