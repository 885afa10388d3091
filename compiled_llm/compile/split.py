"""Splitting a Dynamo graph at every attention op, and hashing the pieces between them.

N attention ops give N+1 compute pieces; the repeated decoder layer yields identical pieces,
which `piece_hash` maps to one key so they compile once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

SPLIT_OPS = ("compiled_llm::attention",)


def is_split_node(node: fx.Node) -> bool:
    """Whether node calls an op the graph is split at (the attention op)."""
    target = node.target
    name = getattr(target, "_schema", None)
    return node.op == "call_function" and name is not None and name.name in SPLIT_OPS


@dataclass
class Piece:
    """One submodule of the split graph: a compute piece, or an attention op alone."""

    name: str  # submodule name in the split graph
    module: fx.GraphModule
    is_split_op: bool


def split_graph(graph_module: fx.GraphModule) -> tuple[fx.GraphModule, list[Piece]]:
    """Partition graph_module so each attention op sits alone between compute pieces."""
    partition, piece_id = {}, 0
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_split_node(node):
            partition[node] = piece_id + 1
            piece_id += 2
        else:
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
