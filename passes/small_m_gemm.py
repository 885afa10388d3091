"""SmallMGemmPass: each matmul of an activation with a 2-D floating weight parameter (a piece
input, or a row slice of one: the fused layouts), mm(x, permute(W, [1, 0])) as nn.Linear without
bias leaves it, becomes `compiled_llm::small_m_mm(x, W)`, which picks the tuned Triton kernel or
cuBLAS per token count at run time (compiled_llm/gemm). CUDA graphs only, unless
PassConfig.small_m_gemm_on_cpu (tests); addmm (bias) and the quantized gemm ops stay as they are.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

import compiled_llm.gemm  # noqa: F401 (registers compiled_llm::small_m_mm)
from compiled_llm.gemm.tuning import MAX_M
from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import insert_op, val

aten = torch.ops.aten
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _is_parameter(node) -> bool:
    """node is a graph input (placeholder or attribute), or a row slice of one."""
    while isinstance(node, Node) and node.target is aten.slice.Tensor and node.args[1] == 0:
        node = node.args[0]
    return isinstance(node, Node) and node.op in ("placeholder", "get_attr")


def _transposed(node) -> Node | None:
    """W for permute(W, [1, 0]) or t(W), else None."""
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if node.target is aten.permute.default and list(node.args[1]) == [1, 0]:
        return node.args[0]
    return node.args[0] if node.target is aten.t.default else None


def match_site(node: Node, devices: set[str]) -> tuple[Node, Node] | None:
    """(x, W) of mm(x, W^T) with W a 2-D weight parameter of x's floating dtype on one of
    devices, and x's token count not known to be above MAX_M; else None."""
    if node.target is not aten.mm.default or len(node.args) != 2 or node.kwargs:
        return None
    x, weight = node.args[0], _transposed(node.args[1])
    x_val, w_val = val(x), val(weight)
    if x_val is None or w_val is None or x_val.dim() != 2 or w_val.dim() != 2:
        return None
    if x_val.dtype not in FLOAT_DTYPES or w_val.dtype != x_val.dtype:
        return None
    if x_val.device.type not in devices or w_val.device != x_val.device:
        return None
    if not all(isinstance(size, int) for size in w_val.shape) or not _is_parameter(weight):
        return None
    rows = x_val.shape[0]
    return None if isinstance(rows, int) and rows > MAX_M else (x, weight)


class SmallMGemmPass(GraphPass):
    """Replace each weight matmul by compiled_llm::small_m_mm (see module)."""

    flag = "enable_small_m_gemm"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        # on the CPU the op is torch.mm: rewriting there only hides the mm from Inductor
        on_cpu = getattr(config, "small_m_gemm_on_cpu", False)
        self.devices = {"cuda", "cpu"} if on_cpu else {"cuda"}

    def apply(self, graph: Graph) -> int:
        """Rewrite every site; returns how many matmuls were replaced."""
        op = torch.ops.compiled_llm.small_m_mm.default
        rewritten = 0
        for node in list(graph.nodes):
            site = match_site(node, self.devices) if node.op == "call_function" else None
            if site is None:
                continue
            transposed = node.args[1]
            (small_m,) = insert_op(graph, node, op, site, 1)
            node.replace_all_uses_with(small_m)
            graph.erase_node(node)
            if not transposed.users:
                graph.erase_node(transposed)
            rewritten += 1
        return rewritten
