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
    flag = "enable_fp8_quant_fusion"

    def apply(self, graph: Graph) -> int:
        n = 0
        for node in list(graph.nodes):
            if node.target is not OPS.silu_and_mul.default:
                continue
            quants = quant_users(node)
            if quants is None:
                continue
            q, s = insert_op(graph, node, OPS.silu_and_mul_quant_fp8.default, node.args, 2)
            rewire_quants(graph, quants, q, s)
            graph.erase_node(node)
            n += 1
        return n
