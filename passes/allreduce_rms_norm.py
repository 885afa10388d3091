"""AllReduceRMSNormFusionPass: a functional sum all-reduce whose only reader is an RMSNorm (with
or without residual add) -> one `compiled_llm::all_reduce[_fused_add]_rms_norm` op.

Runs after the norm passes (it matches their single-node ops). The collective is
`_c10d_functional.all_reduce` + `wait_tensor`, what tensor-parallel layers traced by Dynamo make.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from compiled_llm.passes import comm_ops  # noqa: F401 (registers the ops)
from compiled_llm.passes.base import NormSitePass
from compiled_llm.passes.fx_utils import insert_op, replace_tuple

OPS = torch.ops.compiled_llm
C10D = torch.ops._c10d_functional


def _all_reduce_input(wait: Node) -> tuple[Node, str] | None:
    """(x, group_name) if wait is wait_tensor(all_reduce(x, "sum", group)) read only once."""
    if wait.target is not C10D.wait_tensor.default or len(wait.users) != 1:
        return None
    all_reduce = wait.args[0]
    if not isinstance(all_reduce, Node) or all_reduce.target is not C10D.all_reduce.default:
        return None
    if len(all_reduce.users) != 1 or all_reduce.args[1] != "sum":
        return None
    return all_reduce.args[0], all_reduce.args[2]


class AllReduceRMSNormFusionPass(NormSitePass):
    """norm(all_reduce(x)) -> all_reduce_rms_norm, and the same with a residual add."""

    flag = "enable_allreduce_rms"

    def plain(self, graph: Graph, norm: Node) -> int:
        """rms_norm(wait(all_reduce(x))) -> all_reduce_rms_norm(x)."""
        wait, weight, eps = norm.args
        found = _all_reduce_input(wait) if isinstance(wait, Node) else None
        if found is None:
            return 0
        reduced_input, group = found
        (out,) = insert_op(graph, norm, OPS.all_reduce_rms_norm.default,
                           (reduced_input, weight, eps, group), 1)
        norm.replace_all_uses_with(out)
        _erase(graph, norm, wait)
        return 1

    def with_residual(self, graph: Graph, norm: Node) -> int:
        """fused_add_rms_norm(wait(all_reduce(x)), residual), either operand order ->
        all_reduce_fused_add_rms_norm(x, residual)."""
        lhs, rhs, weight, eps = norm.args
        pairs = [(wait, other) for wait, other in ((lhs, rhs), (rhs, lhs))
                 if isinstance(wait, Node) and _all_reduce_input(wait) is not None]
        if not pairs:
            return 0
        wait, residual = pairs[0]
        reduced_input, group = _all_reduce_input(wait)
        normed, summed = insert_op(graph, norm, OPS.all_reduce_fused_add_rms_norm.default,
                                   (reduced_input, residual, weight, eps, group), 2)
        replace_tuple(graph, norm, [normed, summed])
        _erase(graph, None, wait)
        return 1


def _erase(graph: Graph, norm: Node | None, wait: Node) -> None:
    all_reduce = wait.args[0]
    for node in (norm, wait, all_reduce):
        if node is not None:
            graph.erase_node(node)
