"""Base classes of every graph pass: name, config flag, source-hash id, match counter and timer.

`GraphPass` runs `apply(graph) -> matches` under a timer. `PatternPass` backs `apply` with an
Inductor PatternMatcherPass whose trace-based patterns are built once per process, on first use.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import time
from typing import ClassVar

import torch
from torch._inductor.pattern_matcher import PatternMatcherPass
from torch.fx import Graph, Node


@functools.cache
def source_hash(module_name: str) -> str:
    """sha256 of a module's source: changes whenever the pass's code does."""
    src = inspect.getsource(sys.modules[module_name])
    return hashlib.sha256(src.encode()).hexdigest()


class GraphPass:
    """One pass over a post-grad FX graph. Subclasses set `flag` (a PassConfig field, or None
    for the fixed tail) and implement `apply`, returning how many sites they rewrote. The
    manager builds each with its PassConfig (for options beyond the flag; unused here)."""

    flag: ClassVar[str | None] = None

    def __init__(self, config: object | None = None) -> None:
        self.matches = 0
        self.seconds = 0.0

    @property
    def name(self) -> str:
        """The pass's class name (how stats, counters and dumps refer to it)."""
        return type(self).__name__

    @classmethod
    def uuid(cls) -> str:
        """Id of this pass's code: the hash of its module's source and of the shared base."""
        return hashlib.sha256(
            (source_hash(cls.__module__) + source_hash(__name__)).encode()).hexdigest()

    def apply(self, graph: Graph) -> int:
        """Rewrite graph in place; returns how many sites were rewritten."""
        raise NotImplementedError

    def __call__(self, graph: Graph) -> int:
        """Run once; adds to the counter and timer, and returns this run's matches."""
        start = time.perf_counter()
        matches = self.apply(graph)
        self.seconds += time.perf_counter() - start
        self.matches += matches
        return matches


class SiteRewritePass(GraphPass):
    """A pass that rewrites single op sites: `match_site(node)` gives a site (or None) for each
    call node, `rewrite(graph, node, site)` replaces it; apply counts the rewrites."""

    def match_site(self, node: Node) -> object | None:
        """The site rooted at node, or None."""
        raise NotImplementedError

    def rewrite(self, graph: Graph, node: Node, site) -> None:
        """Replace the matched site in graph."""
        raise NotImplementedError

    def apply(self, graph: Graph) -> int:
        """Rewrite every site; returns how many were rewritten."""
        rewritten = 0
        for node in list(graph.nodes):
            site = self.match_site(node) if node.op == "call_function" else None
            if site is not None:
                self.rewrite(graph, node, site)
                rewritten += 1
        return rewritten


class PatternPass(GraphPass):
    """A pass made of Inductor pattern-matcher patterns, registered by `register`."""

    _registry: ClassVar[dict[type, PatternMatcherPass]] = {}

    def register(self, patterns: PatternMatcherPass) -> None:
        """Add this pass's patterns (register_replacement / register_graph_pattern)."""
        raise NotImplementedError

    def patterns(self) -> PatternMatcherPass:
        """This pass class's patterns, traced and registered once per process."""
        cls = type(self)
        if cls not in PatternPass._registry:
            patterns = PatternMatcherPass(pass_name=self.name)
            self.register(patterns)
            PatternPass._registry[cls] = patterns
        return PatternPass._registry[cls]

    def apply(self, graph: Graph) -> int:
        """Run the patterns over graph; returns the matches replaced."""
        return self.patterns().apply(graph)


def float_dtypes() -> tuple[torch.dtype, ...]:
    """The activation dtypes patterns are traced for (casts differ per dtype in the graph)."""
    return (torch.float32, torch.bfloat16, torch.float16)


def example_tensors(dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Distinct example inputs for tracing a pattern (tracing merges repeated tensor objects)."""
    return [torch.empty(shape, dtype=dtype) for shape in shapes]


class NormSitePass(GraphPass):
    """A pass that visits every fused norm node: `plain` for compiled_llm::rms_norm and
    `with_residual` for compiled_llm::fused_add_rms_norm, each returning 1 if it rewrote it."""

    def apply(self, graph: Graph) -> int:
        """Visit every fused norm node in graph order; returns the sites rewritten."""
        from compiled_llm.passes import ops  # noqa: F401 (registers the ops)

        plain_op = torch.ops.compiled_llm.rms_norm.default
        residual_op = torch.ops.compiled_llm.fused_add_rms_norm.default
        rewritten = 0
        for node in list(graph.nodes):
            if node.target is plain_op:
                rewritten += self.plain(graph, node)
            elif node.target is residual_op:
                rewritten += self.with_residual(graph, node)
        return rewritten

    def plain(self, graph: Graph, norm) -> int:
        """Rewrite one rms_norm node if it fits; 1 if rewritten, else 0."""
        raise NotImplementedError

    def with_residual(self, graph: Graph, norm) -> int:
        """Rewrite one fused_add_rms_norm node if it fits; 1 if rewritten, else 0."""
        raise NotImplementedError
