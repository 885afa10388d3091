"""SiluMulSmallMGemmFusionPass: small_m_mm(silu_and_mul(gate, up), W), the gated MLP's down
projection, becomes `compiled_llm::small_m_mm_silu_mul(gate, up, W)`, whose Triton kernel makes
the activation in its prologue: one kernel fewer per layer. Runs after SmallMGemmPass, before the
tail inlines silu_and_mul; on CUDA only for weights the tuned table gives the Triton kernel (else
the op's fallback would run silu * up eagerly); on the CPU wherever SmallMGemmPass put the op."""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

import compiled_llm.gemm  # noqa: F401 (registers the compiled_llm small-M ops)
from compiled_llm.gemm.tuning import triton_tuned
from compiled_llm.passes import ops  # noqa: F401 (registers compiled_llm::silu_and_mul)
from compiled_llm.passes.base import SiteRewritePass
from compiled_llm.passes.fx_utils import insert_op, val

OPS = torch.ops.compiled_llm


def match_site(node: Node) -> tuple[Node, Node, Node] | None:
    """(gate, up, W) of small_m_mm(silu_and_mul(gate, up), W) whose activation nothing else
    reads, with 2-D gate and up of one shape; else None."""
    if node.target is not OPS.small_m_mm.default:
        return None
    act, weight = node.args
    if not isinstance(act, Node) or act.target is not OPS.silu_and_mul.default:
        return None
    if len(act.users) != 1 or act.kwargs:
        return None
    gate, up = act.args
    gate_val, up_val, w_val = val(gate), val(up), val(weight)
    if gate_val is None or up_val is None or w_val is None or gate_val.dim() != 2:
        return None
    if up_val.shape != gate_val.shape or up_val.dtype != gate_val.dtype:
        return None
    if gate_val.device.type == "cuda" and not triton_tuned(
            gate_val.device, gate_val.dtype, *w_val.shape):
        return None
    return gate, up, weight


class SiluMulSmallMGemmFusionPass(SiteRewritePass):
    """Fold silu_and_mul into the small-M GEMM that alone reads it (see module)."""

    flag = "enable_silu_mul_small_m"
    match_site = staticmethod(match_site)

    def rewrite(self, graph: Graph, node: Node, site) -> None:
        """The gated op in place of the GEMM; the activation goes."""
        act = node.args[0]
        (fused,) = insert_op(graph, node, OPS.small_m_mm_silu_mul.default, site, 1)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(act)
