"""SmallMGemmAddRMSNormFusionPass: fused_add_rms_norm(small_m_mm(x, W), residual), the o and down
projections' residual add + norm, becomes `compiled_llm::small_m_mm_add_rms_norm`, whose kernel
that sums the split-K partials also adds and normalizes: one kernel fewer per site. Runs after
SmallMGemmPass, before the tail inlines the norm; on CUDA only where the tuned table gives the
weight split-K (else Inductor's add + norm kernel stays); on the CPU wherever the op is."""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

import compiled_llm.gemm  # noqa: F401 (registers the compiled_llm small-M ops)
from compiled_llm.gemm.tuning import tuned_splits
from compiled_llm.passes import ops  # noqa: F401 (registers compiled_llm::fused_add_rms_norm)
from compiled_llm.passes.base import SiteRewritePass
from compiled_llm.passes.fx_utils import getitem_users, insert_op, replace_tuple, same_shape, val

OPS = torch.ops.compiled_llm


def _product(node, other) -> Node | None:
    """node if it is a small_m_mm that nothing but the norm reads, of other's shape and dtype."""
    if not isinstance(node, Node) or node.target is not OPS.small_m_mm.default:
        return None
    if len(node.users) != 1 or node.kwargs:
        return None
    product, residual = val(node), val(other)
    if product is None or residual is None or product.dim() != 2:
        return None
    if residual.dtype != product.dtype or not same_shape(product, residual):
        return None  # a broadcast residual stays with Inductor's kernel
    return node


def match_site(node: Node) -> tuple[Node, tuple] | None:
    """(the small_m_mm node, (x, W, residual, norm weight, eps)) of fused_add_rms_norm(
    small_m_mm(x, W), residual, ...) (either operand order) read only through getitems; else
    None."""
    if node.target is not OPS.fused_add_rms_norm.default or node.kwargs:
        return None
    lhs, rhs, norm_weight, eps = node.args
    if lhs is rhs:
        return None
    product = _product(lhs, rhs)
    residual = rhs
    if product is None:
        product, residual = _product(rhs, lhs), lhs
    if product is None or getitem_users(node) is None:
        return None
    x, weight = product.args
    x_val, w_val = val(x), val(weight)
    if x_val is None or w_val is None:
        return None
    splits = tuned_splits(x_val.device, x_val.dtype, *w_val.shape)
    if x_val.device.type == "cuda" and not any(split > 1 for split in splits):
        return None
    return product, (x, weight, residual, norm_weight, eps)


class SmallMGemmAddRMSNormFusionPass(SiteRewritePass):
    """Fold the residual add + RMSNorm into the small-M GEMM's split-K sum (see module)."""

    flag = "enable_small_m_add_rms_norm"
    match_site = staticmethod(match_site)

    def rewrite(self, graph: Graph, node: Node, site) -> None:
        """The fused op in place of the norm's tuple; the product goes."""
        product, args = site
        outs = insert_op(graph, node, OPS.small_m_mm_add_rms_norm.default, args, 2)
        replace_tuple(graph, node, outs)
        graph.erase_node(product)
