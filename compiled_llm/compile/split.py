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
    target = node.target
    name = getattr(target, "_schema", None)
    return node.op == "call_function" and name is not None and name.name in SPLIT_OPS


@dataclass
class Piece:
    name: str  # submodule name in the split graph
    module: fx.GraphModule
    is_split_op: bool


def split_graph(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[Piece]]:
    """Partition gm so each attention op sits alone between compute pieces."""
    part, sid = {}, 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_split_node(node):
            part[node] = sid + 1
            sid += 2
        else:
            part[node] = sid
    split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
    pieces = []
    for name, mod in split.named_children():
        pieces.append(Piece(name, mod, any(is_split_node(n) for n in mod.graph.nodes)))
    return split, pieces


def _describe(val) -> str:
    if isinstance(val, torch.Tensor):
        return f"{val.dtype}{tuple(val.shape)}{tuple(val.stride())}{val.device.type}"
    return repr(val)


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    # a function's repr holds its address: name it by module and qualname instead
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{getattr(target, '__module__', '')}.{name}" if name else str(target)


def piece_hash(gm: fx.GraphModule) -> str:
    """Hash of the piece's computation, blind to node names (layer 3 == layer 7)."""
    index: dict[fx.Node, str] = {}
    lines = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = f"%{i}"
        args = fx.node.map_arg((node.args, node.kwargs), lambda a: index[a])
        target = "" if node.op == "placeholder" else _target_name(node.target)
        val = node.meta.get("example_value", node.meta.get("val"))
        lines.append(f"{node.op}|{target}|{args}|{_describe(val)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]
