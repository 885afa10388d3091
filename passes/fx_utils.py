"""Small FX helpers for the passes that rewrite the graph directly: insert an op with its fake
value, rewire a tuple-returning node's getitem users, compare (symbolic) shapes."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True only when the shapes are provably equal (no guard is added for symbolic dims)."""
    return a.dim() == b.dim() and all(statically_known_true(x == y)
                                      for x, y in zip(a.shape, b.shape))


def val(node) -> torch.Tensor | None:
    """The node's fake tensor, if it carries one."""
    return node.meta.get("val") if isinstance(node, Node) else None


def _fake_call(op, args: Sequence):
    vals = [val(a) if isinstance(a, Node) else a for a in args]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    if any(isinstance(a, Node) and val(a) is None for a in args):
        return None
    mode = detect_fake_mode(tensors)
    if mode is None:
        return None
    with mode:
        return op(*vals)


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
    for i, o in enumerate(outs):
        if fake is not None:
            o.meta["val"] = fake[i]
    return outs


def getitem_users(node: Node) -> dict[int, list[Node]] | None:
    """{index: [getitem nodes]} of a tuple-returning node, or None if some user is not one."""
    out: dict[int, list[Node]] = {}
    for u in node.users:
        if u.target is not operator.getitem:
            return None
        out.setdefault(u.args[1], []).append(u)
    return out


def replace_tuple(graph: Graph, node: Node, new: Sequence[Node | None]) -> None:
    """Point node's getitem(i) users at new[i], then erase node and its getitems."""
    for i, users in (getitem_users(node) or {}).items():
        for g in users:
            if g.users:
                g.replace_all_uses_with(new[i])
            graph.erase_node(g)
    graph.erase_node(node)
