"""L2WeightPrefetchPass: before each attention site of the Dynamo graph, a
`compiled_llm::l2_prefetch` of the weights of the op that reads the attention output (the o
projection), so they stream into L2 while the decode attention kernels leave HBM idle and the
GEMM after attention starts from L2 (compiled_llm/gemm/prefetch.py). Pre-split: the op goes with
attention between the compiled pieces (compile/split.py keeps it there), in program order."""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import example_tensor

# ops whose output is the attention output (a prefetch put between a fused K/V write and its
# attention_no_write still goes with both: compile/split.py)
ATTENTION_OPS = ("compiled_llm::attention", "compiled_llm::attention_no_write",
                 "compiled_llm::qk_norm_rope_attention")
# shape-only steps between the attention output and the op that reads it (and indexing: MLA
# keeps the value width of its padded heads)
VIEW_METHODS = ("view", "reshape", "flatten", "contiguous")
MIN_WEIGHT_BYTES = 1 << 20  # smaller weights are read in a kernel's latency anyway


def _op_name(node) -> str | None:
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return schema.name if isinstance(node, Node) and schema is not None else None


def reader_of(attention: Node) -> Node | None:
    """The one op reading the attention output through shape-only steps, else None."""
    node = attention
    while len(node.users) == 1:
        (user,) = node.users
        view = user.op == "call_method" and user.target in VIEW_METHODS
        if (view or user.target is operator.getitem) and user.args[0] is node:
            node = user
        else:
            return user if user.op == "call_function" else None
    return None


def weights_of(reader: Node, devices: set[str], min_bytes: int) -> list[Node]:
    """reader's weight arguments: graph inputs holding a 2-D or larger tensor of at least
    min_bytes on one of devices."""
    found = []
    for arg in [*reader.args, *reader.kwargs.values()]:
        value = example_tensor(arg)
        if value is None or arg.op != "placeholder":
            continue
        if (value.dim() >= 2 and value.device.type in devices
                and value.numel() * value.element_size() >= min_bytes):
            found.append(arg)
    return found


class L2WeightPrefetchPass(GraphPass):
    """Insert an l2_prefetch of the attention output's reader's weights before each attention
    run (see module). Only on CUDA weights unless PassConfig.l2_weight_prefetch_on_cpu (tests:
    there the op does nothing, and weights of any size get one). The share of L2 each prefetch
    may fill is PassConfig.l2_prefetch_fraction."""

    flag = "enable_l2_weight_prefetch"

    def __init__(self, config=None) -> None:
        super().__init__()
        on_cpu = getattr(config, "l2_weight_prefetch_on_cpu", False)
        self.devices = {"cuda", "cpu"} if on_cpu else {"cuda"}
        self.min_bytes = 0 if on_cpu else MIN_WEIGHT_BYTES
        self.fraction = float(getattr(config, "l2_prefetch_fraction", 0.5))

    def apply(self, graph: Graph) -> int:
        """Insert the prefetches; returns how many attention sites got one."""
        import compiled_llm.gemm.prefetch  # noqa: F401 (registers the op)

        sites = [node for node in graph.nodes if _op_name(node) in ATTENTION_OPS]
        return sum(self._insert(graph, node) for node in sites)

    def _insert(self, graph: Graph, attention: Node) -> int:
        reader = reader_of(attention)
        weights = weights_of(reader, self.devices, self.min_bytes) if reader is not None else []
        hidden = attention.args[0]  # q: its rows are the step's tokens
        if not weights or example_tensor(hidden) is None:
            return 0
        op = torch.ops.compiled_llm.l2_prefetch.default
        with graph.inserting_before(attention):
            for weight in weights:
                graph.call_function(op, (weight, hidden, self.fraction))
        return 1
