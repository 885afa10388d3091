"""SmallMGemmSiluMulFusionPass: silu_and_mul(gate, up) over the two halves of one small_m_mm(x,
W_gate_up), the gated MLP's fused gate/up projection, becomes `compiled_llm::
small_m_gate_up_silu_mul(x, W)`, whose kernel makes silu(gate) * up in its epilogue: one kernel
fewer per layer. After SmallMGemmPass, before the tail inlines silu_and_mul; on CUDA only where
the tuned table gives the epilogue a config (tuning.gate_up_fused); on the CPU wherever it is."""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

import compiled_llm.gemm  # noqa: F401 (registers the compiled_llm small-M ops)
from compiled_llm.gemm.tuning import gate_up_fused
from compiled_llm.passes import ops  # noqa: F401 (registers compiled_llm::silu_and_mul)
from compiled_llm.passes.base import SiteRewritePass
from compiled_llm.passes.fx_utils import insert_op, val

OPS = torch.ops.compiled_llm
aten = torch.ops.aten
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


def _split_range(node: Node) -> tuple[Node, Node, int, int] | None:
    """(split node, source, start, end) of getitem(split(source, sizes, dim 1 or -1), i)."""
    if node.target is not operator.getitem:
        return None
    split, index = node.args
    if not isinstance(split, Node) or split.target not in SPLITS or split.kwargs:
        return None
    source, sizes, dim = (*split.args, 0)[:3]
    if dim not in (1, -1) or not isinstance(source, Node):
        return None
    width = val(source).shape[1] if val(source) is not None and val(source).dim() == 2 else None
    if isinstance(sizes, int):  # split.Tensor: chunks of `sizes`, the last one shorter
        sizes = [sizes] * 2 if width == 2 * sizes else []
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return (split, source, bounds[index], bounds[index + 1]) if index < len(sizes) else None


def _half(node) -> tuple[Node | None, Node, int, int] | None:
    """(split node or None, source, start, end) of a column range of a small_m_mm: a slice, or
    an item of a split."""
    if not isinstance(node, Node) or node.kwargs:
        return None
    if node.target is aten.slice.Tensor:
        source, dim, start, end = (*node.args, None, None, None)[:4]
        step = node.args[4] if len(node.args) > 4 else 1
        found = (None, source, start, end) if dim in (1, -1) and step == 1 else None
    else:
        found = _split_range(node)
    if found is None or not isinstance(found[1], Node):
        return None
    return found if found[1].target is OPS.small_m_mm.default else None


def match_site(node: Node) -> tuple[Node, Node | None] | None:
    """(the small_m_mm, the split between or None) of silu_and_mul(mm[:, :I], mm[:, I:2I]) with
    mm [M, 2I] read by those halves alone; else None."""
    if node.target is not OPS.silu_and_mul.default or node.kwargs:
        return None
    halves = node.args
    if halves[0] is halves[1] or any(len(half.users) != 1 for half in halves
                                     if isinstance(half, Node)):
        return None  # a half read elsewhere too stays (and with it the product)
    gate, up = _half(halves[0]), _half(halves[1])
    if gate is None or up is None or gate[:2] != up[:2]:
        return None
    split, product = gate[:2]
    product_val, w_val = val(product), val(product.args[1])
    if product_val is None or w_val is None or product_val.dim() != 2:
        return None
    width = product_val.shape[1]
    if not isinstance(width, int) or width % 2:
        return None
    if (gate[2:], up[2:]) != ((0, width // 2), (width // 2, width)):
        return None
    readers = set(node.args)
    if set(split.users if split is not None else product.users) != readers or (
            split is not None and len(product.users) != 1):
        return None
    if product_val.device.type == "cuda" and not gate_up_fused(
            product_val.device, product_val.dtype, *w_val.shape):
        return None
    return product, split


class SmallMGemmSiluMulFusionPass(SiteRewritePass):
    """Fold silu_and_mul into the gate/up small-M GEMM it reads (see module)."""

    flag = "enable_small_m_silu_mul"
    match_site = staticmethod(match_site)

    def rewrite(self, graph: Graph, node: Node, site) -> None:
        """The fused op in place of silu_and_mul; its halves, the split and the product go."""
        product, split = site
        halves = node.args
        (fused,) = insert_op(graph, node, OPS.small_m_gate_up_silu_mul.default, product.args, 1)
        node.replace_all_uses_with(fused)
        for dead in (node, *halves, *([split] if split is not None else []), product):
            graph.erase_node(dead)
