"""Warm start without Dynamo: the split graph and the source of each of its inputs, on disk.

The backend stores the split graph (compiled pieces replaced by their cache keys) with each
input's source expression (`L['self']._modules[...]._parameters['weight']`, `L['input_ids']`);
a warm start rebuilds the callable from the cache alone (the key stands in for Dynamo's guards)."""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections.abc import Callable

import torch
from torch import fx, nn

logger = logging.getLogger(__name__)
FORMAT = 1


class PieceRef(nn.Module):
    """Stands in for a compiled piece in a stored graph: its cache key."""

    def __init__(self, key: str, returns_tuple: bool) -> None:
        super().__init__()
        self.key, self.returns_tuple = key, returns_tuple


def snapshot_name(model: nn.Module) -> str:
    """File name for this model's snapshot: a hash of every parameter and buffer's name, dtype,
    shape and device type (e.g. max_len changes the rotary buffer, so the pieces' keys)."""
    items = [*model.named_parameters(), *model.named_buffers()]
    sig = "\n".join(f"{n}|{t.dtype}|{tuple(t.shape)}|{t.device.type}" for n, t in items)
    return f"graph-{hashlib.sha256(sig.encode()).hexdigest()[:16]}.pkl"


def input_sources(gm: fx.GraphModule) -> list[str] | None:
    """The source expression of each graph input, or None if one has none."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        if source is None:
            return None
        names.append(source.name() if callable(source.name) else source.name)
    return names


def _getter(sources: list[str]) -> Callable[[dict], tuple]:
    if any(not s.startswith("L[") for s in sources):
        raise ValueError("an input comes from outside the call's locals")
    return eval(f"lambda L: ({', '.join(sources)},)")  # noqa: S307 (our own graph's sources)


def sources_match(sources: list[str], example_inputs: list, frame_locals: dict) -> bool:
    """Every source evaluates, from the call's locals, to the very input Dynamo saw."""
    try:
        values = _getter(sources)(frame_locals)
    except Exception:
        return False
    return len(values) == len(example_inputs) and all(
        v is e for v, e in zip(values, example_inputs) if isinstance(e, torch.Tensor))


def dumps(split: fx.GraphModule, refs: dict[str, PieceRef], sources: list[str]) -> bytes:
    """The split graph with compiled pieces swapped for their refs, pickled with the sources."""
    kept = {name: getattr(split, name) for name in refs}
    try:
        for name, ref in refs.items():
            setattr(split, name, ref)
        return pickle.dumps({"format": FORMAT, "graph": split, "sources": sources})
    finally:
        for name, mod in kept.items():
            setattr(split, name, mod)


def loads(data: bytes) -> tuple[fx.GraphModule, list[str]]:
    """The split graph and its inputs' sources from a stored snapshot; ValueError if stale."""
    snap = pickle.loads(data)  # noqa: S301 (written by this backend into the user's cache)
    if snap.get("format") != FORMAT:
        raise ValueError(f"snapshot format {snap.get('format')} != {FORMAT}")
    return snap["graph"], snap["sources"]


def warm_forward(graph: fx.GraphModule, sources: list[str], model: nn.Module):
    """forward(input_ids, positions) that calls graph with inputs gathered as Dynamo would.
    Parameters and buffers are looked up once, on the first call, after weights are final."""
    getter = _getter(sources)
    dyn_index = [i for i, s in enumerate(sources) if not s.startswith("L['self']")]
    dynamic = _getter([sources[i] for i in dyn_index])  # the call's inputs and their sizes
    args: list = []

    def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        frame = {"self": model, "input_ids": input_ids, "positions": positions}
        if not args:
            args.extend(getter(frame))
        for i, v in zip(dyn_index, dynamic(frame)):
            args[i] = v
        return graph(*args)[0]

    return forward
