"""SiluMulFusionPass: silu(gate) * up (the gated MLP) -> one `compiled_llm::silu_and_mul` node."""

from __future__ import annotations

import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

from compiled_llm.passes import ops
from compiled_llm.passes.base import PatternPass, example_tensors, float_dtypes


def _pattern(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return ops.silu_and_mul_ref(gate, up)


def _replacement(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.ops.compiled_llm.silu_and_mul.default(gate, up)


class SiluMulFusionPass(PatternPass):
    """Matches Inductor's decomposition of F.silu, traced per dtype."""

    flag = "enable_silu_mul"

    def register(self, patterns: PatternMatcherPass) -> None:
        """silu(gate) * up, traced once per activation dtype."""
        for dtype in float_dtypes():
            args = example_tensors(dtype, (4, 16), (4, 16))
            register_replacement(_pattern, _replacement, args, fwd_only, patterns)
