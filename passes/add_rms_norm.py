"""AddRMSNormFusionPass: residual add + RMSNorm -> one `compiled_llm::fused_add_rms_norm` node.

Two spellings reach the post-grad graph: `x + residual` followed by the norm, and, where Inductor
has already folded the residual into the preceding projection, `addmm(residual, mat1, mat2)`. The
second is unfolded into `mm` + the fused op so the add rides in the norm's kernel.
"""

from __future__ import annotations

import torch
from torch._inductor.pattern_matcher import (
    Match,
    PatternMatcherPass,
    fwd_only,
    register_replacement,
)
from torch.fx.experimental.symbolic_shapes import statically_known_true

from compiled_llm.passes import ops
from compiled_llm.passes.base import PatternPass, example_tensors, float_dtypes
from compiled_llm.passes.fx_utils import same_shape, val


def _add_pattern(x, residual, weight, eps):
    summed = x + residual
    return ops.rms_norm_ref(summed, weight, eps), summed


def _addmm_pattern(residual, mat1, mat2, weight, eps):
    summed = torch.addmm(residual, mat1, mat2)
    return ops.rms_norm_ref(summed, weight, eps), summed


def _add_replacement(x, residual, weight, eps):
    normed, summed = torch.ops.compiled_llm.fused_add_rms_norm.default(x, residual, weight, eps)
    return normed, summed


def _addmm_replacement(residual, mat1, mat2, weight, eps):
    normed, summed = torch.ops.compiled_llm.fused_add_rms_norm.default(
        mat1 @ mat2, residual, weight, eps)
    return normed, summed


def _is_residual(match: Match) -> bool:
    """Only a same-shape residual, not a broadcast bias, makes an add + norm site."""
    residual = val(match.kwargs["residual"])
    if "mat1" in match.kwargs:  # addmm: residual [T, N] against mat1 [T, K]
        mat1 = val(match.kwargs["mat1"])
        return residual is not None and mat1 is not None and residual.dim() == 2 \
            and statically_known_true(residual.shape[0] == mat1.shape[0])
    x = val(match.kwargs["x"])
    return residual is not None and x is not None and same_shape(residual, x)


class AddRMSNormFusionPass(PatternPass):
    """(rms_norm(x + residual), x + residual) -> fused_add_rms_norm(x, residual)."""

    flag = "enable_rms_norm"

    def register(self, patterns: PatternMatcherPass) -> None:
        """Both spellings (add and addmm), traced once per activation dtype."""
        for dtype in float_dtypes():
            add_args = example_tensors(dtype, (4, 16), (4, 16), (16,))
            mm_args = example_tensors(dtype, (4, 16), (4, 8), (8, 16), (16,))
            for pattern, replacement, args in ((_add_pattern, _add_replacement, add_args),
                                               (_addmm_pattern, _addmm_replacement, mm_args)):
                register_replacement(pattern, replacement, [*args, 1e-6], fwd_only, patterns,
                                     extra_check=_is_residual, scalar_workaround={"eps": 1e-6})
