"""Splitting a Dynamo graph at every attention op, and hashing the pieces between them.

N attention ops give N+1 compute pieces; the repeated decoder layer yields identical pieces,
which `piece_hash` maps to one key so they compile once.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

SPLIT_OPS = ("compiled_llm::attention", "compiled_llm::attention_no_write",
             "compiled_llm::qk_norm_rope_kv_write", "compiled_llm::qk_norm_rope_attention")
# ops that go with the split op after them (passes/l2_weight_prefetch.py): in a compiled piece
# nothing would keep their place in the stream
WITH_SPLIT_OPS = ("compiled_llm::l2_prefetch",)


def _op_name(node: fx.Node) -> str | None:
    schema = getattr(node.target, "_schema", None)
    return schema.name if node.op == "call_function" and schema is not None else None


def is_split_node(node: fx.Node) -> bool:
    """Whether node calls an op the graph is split at (attention, the fused QK-norm + RoPE +
    attention, and the fused K/V write that precedes attention_no_write)."""
    return _op_name(node) in SPLIT_OPS


def _goes_with_split(node: fx.Node) -> bool:
    return _op_name(node) in WITH_SPLIT_OPS


def _reads_split_node(node: fx.Node) -> bool:
    """A getitem of a split op's tuple output."""
    return (node.op == "call_function" and node.target is operator.getitem
            and isinstance(node.args[0], fx.Node) and is_split_node(node.args[0]))


@dataclass
class Piece:
    """One submodule of the split graph: a compute piece, or an attention op alone."""

    name: str  # submodule name in the split graph
    module: fx.GraphModule
    is_split_op: bool


def split_graph(graph_module: fx.GraphModule) -> tuple[fx.GraphModule, list[Piece]]:
    """Partition graph_module so each run of split ops (attention, or the fused K/V write, its
    getitems and attention_no_write; the prefetches before them) sits alone between compute
    pieces."""
    partition, piece_id, in_split = {}, 0, False
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        split_side = (is_split_node(node) or _goes_with_split(node)
                      or (in_split and _reads_split_node(node)))
        if split_side != in_split:
            piece_id, in_split = piece_id + 1, split_side
        partition[node] = piece_id
    split = split_module(graph_module, None, lambda node: partition[node], keep_original_order=True)
    pieces = []
    for name, module in split.named_children():
        is_split_op = any(is_split_node(node) for node in module.graph.nodes)
        pieces.append(Piece(name, module, is_split_op))
    return split, pieces


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}{tuple(value.stride())}{value.device.type}"
    return repr(value)


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    # a function's repr holds its address: name it by module and qualname instead
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{getattr(target, '__module__', '')}.{name}" if name else str(target)


def piece_hash(graph_module: fx.GraphModule) -> str:
    """Hash of the piece's computation, blind to node names (layer 3 == layer 7)."""
    index: dict[fx.Node, str] = {}
    lines = []
    for i, node in enumerate(graph_module.graph.nodes):
        index[node] = f"%{i}"
        args = fx.node.map_arg((node.args, node.kwargs), lambda arg: index[arg])
        target = "" if node.op == "placeholder" else _target_name(node.target)
        value = node.meta.get("example_value", node.meta.get("val"))
        lines.append(f"{node.op}|{target}|{args}|{_describe(value)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]
