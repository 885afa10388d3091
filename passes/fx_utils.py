"""Small FX helpers for the passes that rewrite the graph directly: insert an op with its fake
value, rewire a tuple-returning node's getitem users, compare (symbolic) shapes."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true


def same_shape(lhs: torch.Tensor, rhs: torch.Tensor) -> bool:
    """True only when the shapes are provably equal (no guard is added for symbolic dims)."""
    return lhs.dim() == rhs.dim() and all(statically_known_true(x == y)
                                          for x, y in zip(lhs.shape, rhs.shape))


def val(node) -> torch.Tensor | None:
    """The node's fake tensor, if it carries one."""
    return node.meta.get("val") if isinstance(node, Node) else None


def example_tensor(node) -> torch.Tensor | None:
    """A Dynamo graph node's example tensor (example_value, else val), if it carries one."""
    if not isinstance(node, Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None


def _fake_call(op, args: Sequence):
    values = [val(arg) if isinstance(arg, Node) else arg for arg in args]
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    if any(isinstance(arg, Node) and val(arg) is None for arg in args):
        return None
    mode = detect_fake_mode(tensors)
    if mode is None:
        return None
    with mode:
        return op(*values)


def insert_op(graph: Graph, before: Node, op, args: Sequence, n_out: int) -> list[Node]:
    """Insert `op(*args)` before `before`; returns its outputs (getitem nodes if n_out > 1)."""
    fake = _fake_call(op, args)
    with graph.inserting_before(before):
        node = graph.call_function(op, tuple(args))
        if fake is not None:
            node.meta["val"] = fake
        if n_out == 1:
            return [node]
        outs = [graph.call_function(operator.getitem, (node, i)) for i in range(n_out)]
    for i, out in enumerate(outs):
        if fake is not None:
            out.meta["val"] = fake[i]
    return outs


def getitem_users(node: Node) -> dict[int, list[Node]] | None:
    """{index: [getitem nodes]} of a tuple-returning node, or None if some user is not one."""
    by_index: dict[int, list[Node]] = {}
    for user in node.users:
        if user.target is not operator.getitem:
            return None
        by_index.setdefault(user.args[1], []).append(user)
    return by_index


def replace_tuple(graph: Graph, node: Node, new: Sequence[Node | None]) -> None:
    """Point node's getitem(i) users at new[i], then erase node and its getitems."""
    for i, getitems in (getitem_users(node) or {}).items():
        for getitem in getitems:
            if getitem.users:
                getitem.replace_all_uses_with(new[i])
            graph.erase_node(getitem)
    graph.erase_node(node)
