"""SiluMulQuantFusionPass: silu_and_mul feeding only FP8 per-token quant (the down projection of
an FP8 model) -> one `compiled_llm::silu_and_mul_quant_fp8` op."""

from __future__ import annotations

import torch
from torch.fx import Graph

from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import insert_op
from compiled_llm.passes.rms_norm_quant import quant_users, rewire_quants

OPS = torch.ops.compiled_llm


class SiluMulQuantFusionPass(GraphPass):
    """quant_fp8(silu_and_mul(gate, up)) -> silu_and_mul_quant_fp8(gate, up)."""

    flag = "enable_fp8_quant_fusion"

    def apply(self, graph: Graph) -> int:
        """Fuse every silu_and_mul that only quant ops read; returns how many."""
        rewritten = 0
        for node in list(graph.nodes):
            if node.target is not OPS.silu_and_mul.default:
                continue
            quants = quant_users(node)
            if quants is None:
                continue
            quantized, scale = insert_op(graph, node, OPS.silu_and_mul_quant_fp8.default,
                                         node.args, 2)
            rewire_quants(graph, quants, quantized, scale)
            graph.erase_node(node)
            rewritten += 1
        return rewritten
