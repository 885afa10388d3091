"""DuplicateOpEliminationPass (tail): calls of a pure op of ours with the same inputs become
one node. LoRA's sibling projections (q/k/v, gate/up) each call `compiled_llm::lora_delta` on
the group's tensors; after this pass the group's delta is computed once per step."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch.fx import Graph, Node

from compiled_llm.passes.base import GraphPass


def _key(node: Node) -> tuple:
    """What makes two calls equal: the op and its arguments (nodes by identity, constants by
    value; lists as tuples)."""
    def freeze(value):
        if isinstance(value, (list, tuple)):
            return tuple(freeze(item) for item in value)
        return value

    return node.target, freeze(node.args), freeze(tuple(sorted(node.kwargs.items())))


class DuplicateOpEliminationPass(GraphPass):
    """Replace every later call of a listed pure op by the first call with equal inputs."""

    flag = None  # fixed tail
    PURE_OPS: ClassVar[tuple[str, ...]] = ("compiled_llm::lora_delta",)

    def _pure_targets(self) -> set:
        targets = set()
        for name in self.PURE_OPS:
            namespace, _, op_name = name.partition("::")
            packet = getattr(getattr(torch.ops, namespace), op_name, None)
            if packet is not None:
                targets.add(packet.default)
        return targets

    def apply(self, graph: Graph) -> int:
        """Merge the duplicates; returns how many calls went."""
        targets, first, merged = self._pure_targets(), {}, 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in targets:
                continue
            key = _key(node)
            if key in first:
                node.replace_all_uses_with(first[key])
                graph.erase_node(node)
                merged += 1
            else:
                first[key] = node
        return merged
