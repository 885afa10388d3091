"""RMSNormQuantFusionPass: an RMSNorm (plain or with residual add) whose output feeds only FP8
per-token quant ops -> one fused norm+quant op.

The q/k/v (or gate/up) projections of an FP8 model each quantize the same normed activation;
the fused op quantizes it once, so the duplicate quant ops disappear too.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from compiled_llm.passes import ops, quant_ops  # noqa: F401 (registers the ops)
from compiled_llm.passes.base import NormSitePass
from compiled_llm.passes.fx_utils import getitem_users, insert_op, replace_tuple

OPS = torch.ops.compiled_llm


def quant_users(node: Node) -> list[Node] | None:
    """The quant ops reading node, if every user of node is one (else None)."""
    users = list(node.users)
    if users and all(u.target is OPS.quant_fp8_per_token.default for u in users):
        return users
    return None


def rewire_quants(graph: Graph, quants: list[Node], quantized: Node, scale: Node) -> None:
    """Every quant op's (quantized, scale) outputs now come from the fused op."""
    for quant in quants:
        replace_tuple(graph, quant, [quantized, scale])


class RMSNormQuantFusionPass(NormSitePass):
    """quant_fp8(norm(x)) -> one norm+quant op, for every quant reading the same norm."""

    flag = "enable_fp8_quant_fusion"

    def plain(self, graph: Graph, norm: Node) -> int:
        """rms_norm read only by quant ops -> rms_norm_quant_fp8."""
        quants = quant_users(norm)
        if quants is None:
            return 0
        quantized, scale = insert_op(graph, norm, OPS.rms_norm_quant_fp8.default, norm.args, 2)
        rewire_quants(graph, quants, quantized, scale)
        graph.erase_node(norm)
        return 1

    def with_residual(self, graph: Graph, norm: Node) -> int:
        """fused_add_rms_norm whose normed output only quant ops read ->
        fused_add_rms_norm_quant_fp8 (the residual output keeps its readers)."""
        items = getitem_users(norm)
        if not items or len(items.get(0, [])) != 1:
            return 0
        quants = quant_users(items[0][0])
        if quants is None:
            return 0
        quantized, scale, summed = insert_op(
            graph, norm, OPS.fused_add_rms_norm_quant_fp8.default, norm.args, 3)
        rewire_quants(graph, quants, quantized, scale)
        replace_tuple(graph, norm, [None, summed])
        return 1
