"""FusedOpLoweringPass (clean-up tail): inlines the fused ops' reference decompositions so Inductor
generates each as one kernel (norm, norm+quant, SiLU·mul+quant), and the FP8 linear's standalone
quant op likewise. The all-reduce ops stay opaque: a collective is never inlined here.
"""

from __future__ import annotations

import torch
from torch._inductor.pattern_matcher import (
    Arg,
    CallFunction,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)

from compiled_llm.passes import ops, quant_ops
from compiled_llm.passes.base import PatternPass

OPS = torch.ops.compiled_llm

# op -> (number of args, decomposition)
LOWERINGS = {
    "rms_norm": (3, ops.rms_norm_ref),
    "fused_add_rms_norm": (4, ops.fused_add_rms_norm_ref),
    "silu_and_mul": (2, ops.silu_and_mul_ref),
    "quant_fp8_per_token": (1, quant_ops.quant_fp8_ref),
    "rms_norm_quant_fp8": (3, quant_ops.rms_norm_quant_fp8_ref),
    "fused_add_rms_norm_quant_fp8": (4, quant_ops.fused_add_rms_norm_quant_fp8_ref),
    "silu_and_mul_quant_fp8": (2, quant_ops.silu_and_mul_quant_fp8_ref),
}


def _inliner(decomp):
    def handler(match: Match, *args) -> None:
        match.replace_by_example(decomp, list(args))

    return handler


class FusedOpLoweringPass(PatternPass):
    """Always in the tail unless PassConfig.inline_fused_ops is False (then the ops run their
    registered kernels as Inductor fallbacks, the slot for hand-written GPU kernels)."""

    flag = "inline_fused_ops"

    def register(self, patterns: PatternMatcherPass) -> None:
        """One pattern per fused op: the call, replaced by its decomposition."""
        for name, (num_args, decomp) in LOWERINGS.items():
            pattern = CallFunction(getattr(OPS, name).default, *[Arg() for _ in range(num_args)])
            register_graph_pattern(pattern, pass_dict=patterns)(_inliner(decomp))
