"""Each fusion pass on a toy graph: match count, op counts before/after, numerics unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiled_llm.models.layers import rms_norm
from compiled_llm.passes import PassConfig
from compiled_llm.passes.quant_ops import quant_fp8_per_token
from tests.passes.helpers import capture_run

KEEP = PassConfig(inline_fused_ops=False)  # keep the fused ops visible in the final graph


def _inputs(dtype, *shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_add_rms_norm(dtype):
    def fn(x, r, w1, w2):
        a = rms_norm(x, w1, 1e-5)  # plain norm
        h = a * 2 + r
        return rms_norm(h, w2, 1e-6), h  # residual add + norm

    args = _inputs(dtype, (7, 32), (7, 32), (32,), (32,))
    out, before, after, m = capture_run(fn, args, KEEP)
    assert m.matches("RMSNormFusionPass") == 1 and m.matches("AddRMSNormFusionPass") == 1
    assert before["aten.rsqrt"] == 2 and after["aten.rsqrt"] == 0
    assert after["compiled_llm.rms_norm"] == 1 and after["compiled_llm.fused_add_rms_norm"] == 1
    for o, r in zip(out, fn(*args)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_norm_on_3d_heads_matches():
    def fn(q, w):  # Qwen3's per-head q norm: [T, H, D]
        return rms_norm(q, w, 1e-6)

    args = _inputs(torch.float32, (5, 4, 16), (16,))
    out, _, after, m = capture_run(fn, args, KEEP)
    assert m.matches("RMSNormFusionPass") == 1 and after["aten.mean"] == 0
    torch.testing.assert_close(out, fn(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype):
    def fn(g, u):
        return F.silu(g) * u

    args = _inputs(dtype, (6, 48), (6, 48))
    out, before, after, m = capture_run(fn, args, KEEP)
    assert m.matches("SiluMulFusionPass") == 1
    assert after["compiled_llm.silu_and_mul"] == 1 and after["aten.mul"] == 0
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)


def _fp8_mlp(x, r, w, wq, wk, wd):
    h = x + r
    n = rms_norm(h, w, 1e-6)
    outs = []
    for wt in (wq, wk):  # two projections quantize the same normed input
        q, s = quant_fp8_per_token(n)
        outs.append((q.float() * s) @ wt.float())
    act = F.silu(outs[0]) * outs[1]
    q, s = quant_fp8_per_token(act)
    return (q.float() * s) @ wd.float(), h


def test_fp8_quant_fusions_dedupe_and_fuse():
    args = _inputs(torch.bfloat16, (9, 32), (9, 32), (32,), (32, 64), (32, 64), (64, 32))
    out, before, after, m = capture_run(_fp8_mlp, args, KEEP)
    assert before["compiled_llm.quant_fp8_per_token"] == 3
    assert m.matches("RMSNormQuantFusionPass") == 1 and m.matches("SiluMulQuantFusionPass") == 1
    assert after["compiled_llm.quant_fp8_per_token"] == 0
    assert after["compiled_llm.fused_add_rms_norm_quant_fp8"] == 1
    assert after["compiled_llm.silu_and_mul_quant_fp8"] == 1
    for o, r in zip(out, _fp8_mlp(*args)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_lowering_inlines_every_fused_op():
    args = _inputs(torch.bfloat16, (9, 32), (9, 32), (32,), (32, 64), (32, 64), (64, 32))
    out, _, after, m = capture_run(_fp8_mlp, args, PassConfig())
    assert m.matches("FusedOpLoweringPass") == 2
    assert not [k for k in after if k.startswith("compiled_llm.")]
    for o, r in zip(out, _fp8_mlp(*args)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_disabled_flags_leave_graph_alone():
    cfg = PassConfig(enable_noop=False, enable_rms_norm=False, enable_silu_mul=False,
                     enable_fp8_quant_fusion=False, enable_allreduce_rms=False,
                     enable_horizontal_gemm=False, enable_small_m_gemm=False,
                     enable_silu_mul_small_m=False, enable_small_m_silu_mul=False,
                     enable_small_m_add_rms_norm=False, enable_small_m_norm_prologue=False)
    args = _inputs(torch.float32, (7, 32), (32,))
    _, before, after, m = capture_run(lambda x, w: F.silu(rms_norm(x, w, 1e-6)) * x, args, cfg)
    assert before == after
    assert [n for n, _, _ in m.stats] == ["FusedOpLoweringPass", "DuplicateOpEliminationPass",
                                         "DeadCodeEliminationPass"]
