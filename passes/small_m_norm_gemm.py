"""SmallMAddRMSNormGemmFusionPass: small_m_mm(getitem(small_m_mm_add_rms_norm(x, W, residual,
norm, eps), 0), W2) (or small_m_gate_up_silu_mul of it), a residual add + norm read only by the
next GEMM, becomes `compiled_llm::small_m_mm_add_rms_norm_mm`, whose second kernel adds and
normalizes in each program's prologue: one kernel fewer per site. Runs after
SmallMGemmAddRMSNormFusionPass and the SiLU·mul epilogue pass that make its two ops."""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

import compiled_llm.gemm  # noqa: F401 (registers the compiled_llm small-M ops)
from compiled_llm.gemm.tuning import gate_up_fused, triton_tuned
from compiled_llm.passes.base import SiteRewritePass
from compiled_llm.passes.fx_utils import getitem_users, insert_op, replace_tuple, val

OPS = torch.ops.compiled_llm
SECOND = {OPS.small_m_mm.default: False, OPS.small_m_gate_up_silu_mul.default: True}


def _norm_source(normed: Node) -> Node | None:
    """The small_m_mm_add_rms_norm node whose output 0 is normed, read by one node only."""
    if normed.target is not operator.getitem or normed.args[1] != 0 or len(normed.users) != 1:
        return None
    fused = normed.args[0]
    if fused.target is not OPS.small_m_mm_add_rms_norm.default or fused.kwargs:
        return None
    outputs = getitem_users(fused)
    return fused if outputs is not None and len(outputs.get(0, [])) == 1 else None


def _second_tuned(normed: Node, weight2: Node, gate_up: bool) -> bool:
    """Whether the GEMM after the norm may take the prologue: a weight given to the graph (so
    the fused op can go where the norm was), tuned for the Triton kernel on CUDA."""
    normed_val, w_val = val(normed), val(weight2)
    if normed_val is None or w_val is None or weight2.op not in ("placeholder", "get_attr"):
        return False
    if normed_val.device.type != "cuda":
        return True
    tuned = gate_up_fused if gate_up else triton_tuned
    return tuned(normed_val.device, normed_val.dtype, *w_val.shape)


def match_site(node: Node) -> tuple[Node, tuple] | None:
    """(the small_m_mm_add_rms_norm node, the fused op's args) of a second GEMM over its normed
    output that nothing else reads; else None."""
    gate_up = SECOND.get(node.target)
    if gate_up is None or node.kwargs or not isinstance(node.args[0], Node):
        return None
    normed, weight2 = node.args
    fused = _norm_source(normed)
    if fused is None or not _second_tuned(normed, weight2, gate_up):
        return None
    return fused, (*fused.args, weight2, gate_up)


class SmallMAddRMSNormGemmFusionPass(SiteRewritePass):
    """Move the residual add + RMSNorm into the next small-M GEMM's prologue (see module)."""

    flag = "enable_small_m_norm_prologue"
    match_site = staticmethod(match_site)

    def rewrite(self, graph: Graph, node: Node, site) -> None:
        """The pair's op where the norm was (its args and the weight come before it); the
        second GEMM and the norm go."""
        fused, args = site
        out, summed = insert_op(graph, fused, OPS.small_m_mm_add_rms_norm_mm.default, args, 2)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        replace_tuple(graph, fused, [None, summed])
