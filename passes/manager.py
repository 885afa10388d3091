"""PassConfig and PassManager: the ordered, flag-selected post-grad passes plus a fixed clean-up
tail, run as Inductor's `post_grad_custom_post_pass` on each piece of the model graph.

The manager counts and times every pass (`stats`), hashes the config and the passes' sources
into `uuid()` (Inductor's cache key) and `PassConfig.key()` (ours), and dumps on request.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph

from compiled_llm.passes.add_rms_norm import AddRMSNormFusionPass
from compiled_llm.passes.allreduce_rms_norm import AllReduceRMSNormFusionPass
from compiled_llm.passes.base import GraphPass, source_hash
from compiled_llm.passes.dump import GraphDump
from compiled_llm.passes.duplicate_ops import DuplicateOpEliminationPass
from compiled_llm.passes.horizontal_gemm import HorizontalGemmFusionPass
from compiled_llm.passes.l2_weight_prefetch import L2WeightPrefetchPass
from compiled_llm.passes.lower import FusedOpLoweringPass
from compiled_llm.passes.noop import NoOpEliminationPass
from compiled_llm.passes.qk_norm_rope import QKNormRoPEKVWriteFusionPass
from compiled_llm.passes.rms_norm import RMSNormFusionPass
from compiled_llm.passes.rms_norm_quant import RMSNormQuantFusionPass
from compiled_llm.passes.silu_mul import SiluMulFusionPass
from compiled_llm.passes.silu_mul_quant import SiluMulQuantFusionPass
from compiled_llm.passes.silu_mul_small_m import SiluMulSmallMGemmFusionPass
from compiled_llm.passes.small_m_add_rms_norm import SmallMGemmAddRMSNormFusionPass
from compiled_llm.passes.small_m_gemm import SmallMGemmPass
from compiled_llm.passes.small_m_norm_gemm import SmallMAddRMSNormGemmFusionPass
from compiled_llm.passes.small_m_silu_mul import SmallMGemmSiluMulFusionPass

# Order matters: add+norm before norm (norm is its sub-pattern); the all-reduce and quant passes
# match the single-node ops the norm and SiLU·mul passes leave behind. The horizontal GEMM
# fusion goes next to last: the patterns before it match the per-projection spelling; the
# small-M GEMM op goes next, over the matmuls it leaves (one per fused weight), then the down
# projection's takes in the SiLU·mul it alone reads (opt-in, so asked for it wins), else the gate/up
# projection's takes it as an epilogue, and the o and down projections the residual add + norm
# after them (all before the tail inlines silu_and_mul and the norm); last, the GEMM after such a
# norm may take it into its prologue.
PASSES: tuple[type[GraphPass], ...] = (
    NoOpEliminationPass, AddRMSNormFusionPass, RMSNormFusionPass, SiluMulFusionPass,
    AllReduceRMSNormFusionPass, RMSNormQuantFusionPass, SiluMulQuantFusionPass,
    HorizontalGemmFusionPass, SmallMGemmPass, SiluMulSmallMGemmFusionPass,
    SmallMGemmSiluMulFusionPass, SmallMGemmAddRMSNormFusionPass, SmallMAddRMSNormGemmFusionPass,
)
# run on the whole Dynamo graph before the split at attention (their ops go with attention);
# each is built with the PassConfig; the prefetch last, before the attention ops the first leaves
PRE_SPLIT_PASSES: tuple[type[GraphPass], ...] = (QKNormRoPEKVWriteFusionPass, L2WeightPrefetchPass)


class DeadCodeEliminationPass(GraphPass):
    """Tail: drop nodes nothing reads (impure ops are kept by FX)."""

    def apply(self, graph: Graph) -> int:
        """Eliminate dead nodes; returns how many went."""
        before = len(graph.nodes)
        graph.eliminate_dead_code()
        return before - len(graph.nodes)


@dataclass
class PassConfig:
    """Which passes run. dump_dir only adds files, so it is not part of the key."""

    enable_noop: bool = True
    enable_rms_norm: bool = True
    enable_silu_mul: bool = True
    enable_fp8_quant_fusion: bool = True  # matches only graphs holding FP8 quant ops
    enable_allreduce_rms: bool = True  # matches only graphs holding all-reduces
    enable_horizontal_gemm: bool = True  # matches only fused weight layouts (fuse_weights.py)
    # weight matmuls -> compiled_llm::small_m_mm (tuned Triton or cuBLAS per token count)
    enable_small_m_gemm: bool = True
    # ... on CPU graphs too (tests): there the op is torch.mm, hidden from Inductor
    small_m_gemm_on_cpu: bool = False
    # small_m_mm(silu_and_mul(gate, up), W) -> compiled_llm::small_m_mm_silu_mul, one kernel;
    # opt-in: with it the H200's batch-1 step was slower (docs/benchmarks.md, call 35)
    enable_silu_mul_small_m: bool = False
    # silu_and_mul of small_m_mm(x, W_gate_up)'s halves -> compiled_llm::small_m_gate_up_silu_mul:
    # the SiLU·mul in the GEMM's epilogue (on CUDA where the tuned table gives the epilogue a
    # config: its own tuned tile, 1.08x the GEMM + SiLU·mul kernel on the H200's Qwen3-0.6B)
    enable_small_m_silu_mul: bool = True
    # fused_add_rms_norm(small_m_mm(x, W), residual) -> compiled_llm::small_m_mm_add_rms_norm:
    # the split-K sum adds and normalizes (split-K weights only on CUDA)
    enable_small_m_add_rms_norm: bool = True
    # small_m_mm(normed of small_m_mm_add_rms_norm, W2) -> compiled_llm::small_m_mm_add_rms_norm_mm:
    # the add + norm in the next GEMM's prologue, one kernel fewer per site (Qwen3-0.6B batch 1
    # on the H200: 1,015-1,043 tok/s against 807-954 without, docs/benchmarks.md call 67)
    enable_small_m_norm_prologue: bool = True
    # pre-split: [q/k norm +] RoPE + KV write, one op (CUDA graphs; 1.07 / 1.06 / 1.02x at
    # batch 1 / 8 / 32 on the H200's Qwen3-0.6B, docs/benchmarks.md, call 60)
    enable_qk_norm_rope_kv_write: bool = True
    # ... on CPU too: there the op runs the reference eagerly, slower than Inductor's kernels
    qk_norm_rope_kv_write_on_cpu: bool = False
    # pre-split: before each attention, an L2 prefetch of the o projection's weight (decode of
    # up to 16 tokens on Hopper; elsewhere the op does nothing), at most this share of the L2;
    # opt-in: 1% slower end to end on the H100 (docs/benchmarks.md, call 102)
    enable_l2_weight_prefetch: bool = False
    l2_prefetch_fraction: float = 0.5
    l2_weight_prefetch_on_cpu: bool = False  # tests: the graph gets the op, which does nothing
    inline_fused_ops: bool = True  # tail: let Inductor generate the fused ops' kernels
    dump_dir: str | None = None

    def pass_classes(self) -> list[type[GraphPass]]:
        """The configured passes in order, then the tail."""
        head = [cls for cls in PASSES if getattr(self, cls.flag)]
        tail = [FusedOpLoweringPass] if self.inline_fused_ops else []
        return head + tail + [DuplicateOpEliminationPass, DeadCodeEliminationPass]

    def pre_split_classes(self) -> list[type[GraphPass]]:
        """The configured passes that run on the Dynamo graph before the split."""
        return [cls for cls in PRE_SPLIT_PASSES if getattr(self, cls.flag)]

    def key(self) -> str:
        """Stable hash of the flags and of the source of every pass that runs."""
        flags = {k: v for k, v in asdict(self).items() if k != "dump_dir"}
        classes = self.pre_split_classes() + self.pass_classes()
        ids = [f"{cls.__name__}:{cls.uuid()}" for cls in classes]
        blob = json.dumps({"flags": flags, "passes": ids, "manager": source_hash(__name__)},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


class PassManager(CustomGraphPass):
    """Callable on a post-grad fx.Graph; use as `post_grad_custom_post_pass`."""

    def __init__(self, config: PassConfig | None = None) -> None:
        self.config = config or PassConfig()
        self.passes = [cls(self.config) for cls in self.config.pass_classes()]
        self.pre_split_passes = [cls(self.config) for cls in self.config.pre_split_classes()]
        self.piece_name = "graph"
        self.last_stats: list[tuple[str, int, float]] = []

    def set_dump_dir(self, path: str | None, piece_name: str = "graph") -> None:
        """Dump the next graphs under path/piece_name (None turns dumping off)."""
        self.config.dump_dir = None if path is None else str(path)
        self.piece_name = piece_name

    @property
    def stats(self) -> list[tuple[str, int, float]]:
        """(pass name, matches, seconds) per pass, summed over every graph run so far."""
        return [(graph_pass.name, graph_pass.matches, graph_pass.seconds)
                for graph_pass in self.passes]

    def matches(self, name: str) -> int:
        """Total matches of the pass called name, pre-split ones included (0 if it is not
        configured)."""
        return sum(graph_pass.matches for graph_pass in self.pre_split_passes + self.passes
                   if graph_pass.name == name)

    def add_stats(self, stats: list[tuple[str, int, float]]) -> None:
        """Count a graph's (pass name, matches, seconds) run by a copy of this manager (a
        compile child's), as if this one had run it."""
        by_name = {graph_pass.name: graph_pass for graph_pass in self.passes}
        for name, matches, seconds in stats:
            if name in by_name:
                by_name[name].matches += matches
                by_name[name].seconds += seconds
        self.last_stats = list(stats)

    def uuid(self) -> str:
        """Inductor's cache key for this manager: PassConfig.key()."""
        return self.config.key()

    def pre_split(self, graph: Graph) -> list[tuple[str, int, float]]:
        """Run the pre-split passes on a whole Dynamo graph; (name, matches, seconds) each."""
        stats = []
        for graph_pass in self.pre_split_passes:
            before = graph_pass.seconds
            matches = graph_pass(graph)
            stats.append((graph_pass.name, matches, graph_pass.seconds - before))
        if stats:
            graph.lint()
        return stats

    def __call__(self, graph: Graph) -> None:
        dump = (GraphDump(self.config.dump_dir, self.piece_name, graph)
                if self.config.dump_dir else None)
        self.last_stats = []
        for index, graph_pass in enumerate(self.passes, start=1):
            before = graph_pass.seconds
            matches = graph_pass(graph)
            seconds = graph_pass.seconds - before
            self.last_stats.append((graph_pass.name, matches, seconds))
            if dump is not None:
                dump.after_pass(index, graph_pass.name, matches, seconds, graph)
        graph.lint()
        if dump is not None:
            dump.finish()
