"""RMSNormFusionPass: the models' decomposed RMSNorm -> one `compiled_llm::rms_norm` node.

Matches the post-grad spelling of models/layers.py's rms_norm for each activation dtype (float32
has no casts; bf16/fp16 upcast and cast back), with eps taken from the graph.
"""

from __future__ import annotations

import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

from compiled_llm.passes import ops
from compiled_llm.passes.base import PatternPass, example_tensors, float_dtypes


def _pattern(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return ops.rms_norm_ref(x, weight, eps)


def _replacement(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.compiled_llm.rms_norm.default(x, weight, eps)


class RMSNormFusionPass(PatternPass):
    """rms_norm(x, weight, eps) without a residual add in front (first layer, q/k norms)."""

    flag = "enable_rms_norm"

    def register(self, patterns: PatternMatcherPass) -> None:
        """The decomposed norm, traced once per activation dtype."""
        for dtype in float_dtypes():
            args = [*example_tensors(dtype, (4, 16), (16,)), 1e-6]
            register_replacement(_pattern, _replacement, args, fwd_only, patterns,
                                 scalar_workaround={"eps": 1e-6})
