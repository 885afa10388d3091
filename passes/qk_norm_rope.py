"""QKNormRoPEKVWriteFusionPass: [q_norm, k_norm] + rotary + attention(q, k, v) ->
qk_norm_rope_attention(q, k, v, cos, sin, ...), matched on the Dynamo graph (models/layers.py's
rms_norm, models/rotary.py's apply_rotary) before the split at attention, walking back from each
attention op's q and k; a site that does not fit stays. The op writes K/V and attends in one
kernel on all-decode steps, in two (the fused write, then attention) on others."""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch.fx import Graph, Node

from compiled_llm.passes.base import GraphPass
from compiled_llm.passes.fx_utils import example_tensor

# Why before the split: the fused op carries the layer index (which cache it writes) and reads
# the step's slot mapping, so it goes with attention between the compiled pieces; inside a piece
# the constant layer index would make every layer's piece distinct (N compiles instead of one).


class Rotation(NamedTuple):
    """heads * cos + cat([-second_half, first_half]) * sin, and the nodes that spell it."""

    heads: Node
    cos: Node
    sin: Node
    nodes: tuple[Node, ...]


class Norm(NamedTuple):
    """weight * (x * rsqrt(mean(x^2) + eps)).to(dtype) over x.float(), and its nodes."""

    x: Node
    weight: Node
    eps: float
    nodes: tuple[Node, ...]


def _call(node, target, nargs: int) -> bool:
    """node is call_function(target) or call_method(target) with nargs positional args."""
    if not isinstance(node, Node) or len(node.args) != nargs:
        return False
    kind = "call_method" if isinstance(target, str) else "call_function"
    return node.op == kind and node.target == target


def _cast_to(node, dtype: torch.dtype) -> Node | None:
    """x for x.to(dtype), else None."""
    if _call(node, "to", 2) and node.args[1] == dtype and not node.kwargs:
        return node.args[0]
    return None


def _halves(cat: Node) -> Node | None:
    """heads for torch.cat([-second_half, first_half], -1) over heads.chunk(2, dim=-1)."""
    if not _call(cat, torch.cat, 2) or cat.args[1] != -1 or cat.kwargs:
        return None
    parts = cat.args[0]
    if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        return None
    neg, first = parts
    if not _call(neg, operator.neg, 1):
        return None
    second = neg.args[0]
    if not (_call(first, operator.getitem, 2) and _call(second, operator.getitem, 2)):
        return None
    chunk = first.args[0]
    if (first.args[1], second.args[1]) != (0, 1) or second.args[0] is not chunk:
        return None
    if not _call(chunk, "chunk", 2) or chunk.args[1] != 2 or chunk.kwargs != {"dim": -1}:
        return None
    return chunk.args[0]


def _one_row_per_token(table, heads: torch.Tensor) -> bool:
    """table is cos or sin [T, 1, D] for heads [T, H, D] (the op reads one row per token)."""
    value = example_tensor(table)
    return (value is not None and value.dim() == 3 and value.shape[1] == 1
            and value.shape[2] == heads.shape[2] and heads.shape[2] % 2 == 0)


def match_rotation(node) -> Rotation | None:
    """The rotation producing node (models/rotary.py _rotate), or None."""
    if not _call(node, operator.add, 2):
        return None
    lhs, rhs = node.args
    if not (_call(lhs, operator.mul, 2) and _call(rhs, operator.mul, 2)):
        return None
    heads, cos_cast = lhs.args
    cat, sin_cast = rhs.args
    heads_val = example_tensor(heads)
    if heads_val is None or heads_val.dim() != 3 or _halves(cat) is not heads:
        return None
    cos, sin = _cast_to(cos_cast, heads_val.dtype), _cast_to(sin_cast, heads_val.dtype)
    if not (_one_row_per_token(cos, heads_val) and _one_row_per_token(sin, heads_val)):
        return None
    neg, first = cat.args[0]
    nodes = (node, lhs, rhs, cos_cast, sin_cast, cat, neg, first, neg.args[0], first.args[0])
    return Rotation(heads, cos, sin, nodes)


def match_norm(node) -> Norm | None:
    """The per-head RMSNorm producing node (models/layers.py rms_norm), or None."""
    if not _call(node, operator.mul, 2):
        return None
    weight, cast = node.args
    value = example_tensor(node)
    weight_val = example_tensor(weight)
    if value is None or weight_val is None or tuple(weight_val.shape) != (value.shape[-1],):
        return None
    scaled = _cast_to(cast, value.dtype)
    if not _call(scaled, operator.mul, 2):
        return None
    x_f32, rsqrt = scaled.args
    if not (_call(x_f32, "float", 1) and _call(rsqrt, torch.rsqrt, 1)):
        return None
    add = rsqrt.args[0]
    if not _call(add, operator.add, 2) or not isinstance(add.args[1], float):
        return None
    mean, eps = add.args
    if not (_call(mean, "mean", 2) and mean.args[1] == -1 and mean.kwargs == {"keepdim": True}):
        return None
    power = mean.args[0]
    if not (_call(power, "pow", 2) and power.args == (x_f32, 2)):
        return None
    return Norm(x_f32.args[0], weight, eps, (node, cast, scaled, rsqrt, add, mean, power, x_f32))


def _erase_dead(graph: Graph, nodes) -> None:
    """Erase the matched nodes nothing reads any more (users first)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in sorted(set(nodes), key=order.__getitem__, reverse=True):
        if not node.users:
            graph.erase_node(node)


class QKNormRoPEKVWriteFusionPass(GraphPass):
    """Each attention whose q and k are rotated by one cos/sin (each normed per head first, or
    neither, or one) becomes one qk_norm_rope_attention op. Pre-split: see module.
    Only on CUDA tensors unless PassConfig.qk_norm_rope_kv_write_on_cpu (tests, CPU numerics)."""

    flag = "enable_qk_norm_rope_kv_write"

    def __init__(self, config=None) -> None:
        super().__init__()
        # the fused kernel is Triton's (CUDA); elsewhere the op runs the reference eagerly,
        # which is slower than the kernels Inductor generates for the unfused norm and RoPE
        self.devices = {"cuda", "cpu"} if getattr(config, "qk_norm_rope_kv_write_on_cpu", False) \
            else {"cuda"}

    def apply(self, graph: Graph) -> int:
        """Rewrite every attention site that fits; returns how many were rewritten."""
        import compiled_llm.attention  # noqa: F401 (registers the ops)

        attention = torch.ops.compiled_llm.attention.default
        sites = [node for node in graph.nodes if node.target is attention]
        return sum(self._rewrite(graph, node) for node in sites)

    def _rewrite(self, graph: Graph, node: Node) -> int:
        q_rot, k_rot = match_rotation(node.args[0]), match_rotation(node.args[1])
        if q_rot is None or k_rot is None or (q_rot.cos, q_rot.sin) != (k_rot.cos, k_rot.sin):
            return 0
        q_norm, k_norm = match_norm(q_rot.heads), match_norm(k_rot.heads)
        if q_norm is not None and k_norm is not None and q_norm.eps != k_norm.eps:
            return 0
        v_val = example_tensor(node.args[2])
        if v_val is None or v_val.dim() != 3 or v_val.device.type not in self.devices:
            return 0
        eps = next((n.eps for n in (q_norm, k_norm) if n is not None), 0.0)
        q = q_norm.x if q_norm is not None else q_rot.heads
        k = k_norm.x if k_norm is not None else k_rot.heads
        weights = [None if n is None else n.weight for n in (q_norm, k_norm)]
        fused_op = torch.ops.compiled_llm.qk_norm_rope_attention.default
        args = (q, k, node.args[2], q_rot.cos, q_rot.sin, *weights, eps, *node.args[3:])
        with graph.inserting_before(node):
            fused = graph.call_function(fused_op, args, dict(node.kwargs))
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        matched = [*q_rot.nodes, *k_rot.nodes, *(q_norm.nodes if q_norm else ()),
                   *(k_norm.nodes if k_norm else ())]
        _erase_dead(graph, matched)
        return 1
