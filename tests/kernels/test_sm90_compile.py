"""Compiles the sampler's, the small-M GEMM's (its epilogue's too) and the W4A16 GEMV's Triton
kernels for the H200 (sm_90) on a machine without a GPU: every constexpr specialization the
engine launches goes through Triton's whole pipeline (TTIR, TTGIR, LLVM, PTX, ptxas), which the
interpreter skips. Under Triton 3.6 (the H200 image's) the kernel without top-k once failed in
TTGIR; this runs under whichever Triton is installed."""

from __future__ import annotations

import itertools

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from compiled_llm.gemm import epilogue  # noqa: E402
from compiled_llm.gemm import kernels as small_m  # noqa: E402
from compiled_llm.quantization.kernels import w4a16  # noqa: E402
from compiled_llm.sample import fused_topk  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
POINTERS = {"logits_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64",
            "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "out_ptr": "*i64", "kept_ptr": "*i8",
            "seed": "i32", "vocab": "i32", "stride_row": "i32"}


def compile_fused_topk(has_top_k: bool, has_top_p: bool, has_min_p: bool, store_kept: bool):
    """The fused top-k/top-p/min-p kernel as sm_90 machine code, for one specialization."""
    constants = dict(STORE_KEPT=store_kept, HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p,
                     HAS_MIN_P=has_min_p, EPS=1e-5, BLOCK=fused_topk.BLOCK,
                     PIVOTS=fused_topk.PIVOTS)
    # an absent parameter's pointer is the temperature's (fused_topk_sample passes it)
    signature = dict(POINTERS, **{name: "constexpr" for name in constants})
    if not has_top_k:
        signature["top_k_ptr"] = "*fp32"
    source = ASTSource(fused_topk._fused_topk_sample_kernel, signature, constants, {})
    return triton.compile(source, target=SM90, options={"num_warps": 8})


@pytest.mark.parametrize("has_top_k,has_top_p,has_min_p",
                         list(itertools.product([True, False], repeat=3)))
def test_fused_topk_compiles_for_sm90(has_top_k, has_top_p, has_min_p):
    try:
        kernel = compile_fused_topk(has_top_k, has_top_p, has_min_p, store_kept=False)
    except (ImportError, KeyError) as err:  # a Triton build without the NVIDIA backend
        pytest.skip(f"no sm_90 backend: {err}")
    assert kernel.asm["cubin"]


def test_fused_topk_with_kept_sets_compiles_for_sm90():
    """The tests' specialization (STORE_KEPT) without top-k: the one that failed."""
    try:
        kernel = compile_fused_topk(False, True, True, store_kept=True)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    assert kernel.asm["cubin"]


GEMM_ARGS = {"x_ptr": "*bf16", "u_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
             "part_ptr": "*fp32", "counter_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
             "stride_xm": "i32", "stride_um": "i32", "stride_wn": "i32", "stride_os": "i32"}


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("use_dot", [False, True])
@pytest.mark.parametrize("split_k,fused_sum", [(1, False), (4, True), (4, False)])
def test_small_m_gemm_compiles_for_sm90(gated, use_dot, split_k, fused_sum):
    """The split-K sum in one launch: after a barrier one thread's acquire-release add on the
    column block's counter, its old value broadcast to the program (a uniform branch), the
    partials read from L2 (.cg); the counter reset. Neither without a fused sum. GATED: the
    SiLU·mul prologue's exp (libdevice's, built on ex2) only there."""
    constants = dict(BLOCK_M=16 if use_dot else 2, BLOCK_N=32, BLOCK_K=256, SPLIT_K=split_k,
                     EVEN_K=False, USE_DOT=use_dot, PRECISION="tf32", FUSED_SUM=fused_sum,
                     GATED=gated, PDL=0, GATE_UP=False)
    signature = dict(GEMM_ARGS, **{name: "constexpr" for name in constants})
    source = ASTSource(small_m._small_m_kernel, signature, constants, {})
    kernel = _compile_or_skip(source, num_warps=4, num_stages=3)
    assert kernel.asm["cubin"]
    ptx = kernel.asm["ptx"]
    assert ptx.count("atom.global.gpu.acq_rel.add") == int(fused_sum)
    assert ("ld.global.cg" in ptx) == fused_sum and ("exch" in ptx) == fused_sum
    assert ("ex2.approx" in ptx) == gated
    assert "griddepcontrol" not in ptx


@pytest.mark.parametrize("use_dot,split_k", [(False, 1), (True, 1), (True, 4)])
def test_small_m_gemm_pdl_reads_weights_before_it_waits(use_dot, split_k):
    """Under PDL the kernel waits for the kernel before (griddepcontrol.wait) and lets the next
    one launch; its first W tile is loaded before the wait, every store comes after it."""
    constants = dict(BLOCK_M=16 if use_dot else 2, BLOCK_N=32, BLOCK_K=256, SPLIT_K=split_k,
                     EVEN_K=True, USE_DOT=use_dot, PRECISION="tf32", FUSED_SUM=False,
                     GATED=False, PDL=2, GATE_UP=False)
    signature = dict(GEMM_ARGS, **{name: "constexpr" for name in constants})
    source = ASTSource(small_m._small_m_kernel, signature, constants, {})
    ptx = _compile_or_skip(source, num_warps=4, num_stages=3).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") > wait
    assert ptx.index("ld.global") < wait < ptx.index("st.global")


def test_small_m_gemm_pdl_level_1_waits_without_the_early_trigger():
    constants = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, EVEN_K=True, USE_DOT=True,
                     PRECISION="tf32", FUSED_SUM=False, GATED=False, PDL=1, GATE_UP=False)
    signature = dict(GEMM_ARGS, **{name: "constexpr" for name in constants})
    source = ASTSource(small_m._small_m_kernel, signature, constants, {})
    ptx = _compile_or_skip(source, num_warps=4, num_stages=3).asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "launch_dependents" not in ptx


def test_sum_splits_kernel_waits_first_under_pdl():
    constants = dict(SPLIT_K=4, BLOCK=1024, PDL=2)
    signature = dict(part_ptr="*fp32", out_ptr="*bf16", numel="i32",
                     **{name: "constexpr" for name in constants})
    source = ASTSource(small_m.sum_splits_kernel, signature, constants, {})
    ptx = _compile_or_skip(source, num_warps=4).asm["ptx"]
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


@pytest.mark.parametrize("use_dot", [False, True])
@pytest.mark.parametrize("pdl", [0, 2])
def test_gate_up_epilogue_compiles_for_sm90(use_dot, pdl):
    """GATE_UP: two W tiles a K step (gate rows, then up rows) and the SiLU's exp in the
    epilogue; under PDL one wait, before any store."""
    constants = dict(BLOCK_M=16 if use_dot else 2, BLOCK_N=32, BLOCK_K=256, SPLIT_K=1,
                     EVEN_K=True, USE_DOT=use_dot, PRECISION="tf32", FUSED_SUM=False,
                     GATED=False, PDL=pdl, GATE_UP=True)
    signature = dict(GEMM_ARGS, **{name: "constexpr" for name in constants})
    source = ASTSource(small_m._small_m_kernel, signature, constants, {})
    ptx = _compile_or_skip(source, num_warps=4, num_stages=3).asm["ptx"]
    assert "ex2.approx" in ptx and ptx.count("griddepcontrol.wait") == int(pdl > 0)
    if pdl:
        assert ptx.index("griddepcontrol.wait") < ptx.index("st.global")


def test_silu_mul_halves_compiles_for_sm90():
    constants = dict(BLOCK=1024)
    signature = dict(src_ptr="*bf16", out_ptr="*bf16", width="i32", stride_src="i32",
                     **{name: "constexpr" for name in constants})
    source = ASTSource(epilogue._silu_mul_kernel, signature, constants, {})
    assert "ex2.approx" in _compile_or_skip(source, num_warps=4).asm["ptx"]


@pytest.mark.parametrize("split_k,pdl", [(1, 0), (4, 0), (4, 2)])
def test_sum_add_rms_norm_compiles_for_sm90(split_k, pdl):
    """The epilogue: the row's sum of squares reduced across warps (shared memory), libdevice's
    rsqrt; under PDL it waits before its first read."""
    constants = dict(SPLIT_K=split_k, BLOCK_N=1024, PDL=pdl)
    signature = dict(part_ptr="*fp32" if split_k > 1 else "*bf16", res_ptr="*bf16",
                     w_ptr="*bf16", normed_ptr="*bf16", summed_ptr="*bf16", N="i32",
                     stride_split="i32", stride_res="i32", eps="fp32",
                     **{name: "constexpr" for name in constants})
    source = ASTSource(epilogue._sum_add_rms_norm_kernel, signature, constants, {})
    ptx = _compile_or_skip(source, num_warps=4).asm["ptx"]
    assert "rsqrt.approx" in ptx and "bar.sync" in ptx
    assert ("griddepcontrol.wait" in ptx) == bool(pdl)
    if pdl:
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


def _compile_or_skip(source, **options):
    """source compiled for sm_90 with these options; the test skips where Triton has no sm_90
    backend."""
    try:
        return triton.compile(source, target=SM90, options=options)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")


GEMV_ARGS = {"qweight_ptr": "*i32", "zeros_ptr": "*u8", "N": "i32", "K": "i32",
             "nibble_mask": "i32", "stride_xm": "i32", "stride_qn": "i32", "stride_sn": "i32",
             "stride_zn": "i32", "stride_os": "i32", "stride_om": "i32"}
# pointers 16-byte aligned and K, row strides multiples of 16, as Triton specializes them
GEMV_ALIGNED = ("x_ptr", "qweight_ptr", "scales_ptr", "zeros_ptr", "out_ptr", "K", "stride_xm",
                "stride_qn")


@pytest.mark.parametrize("rows,group,block_n,block_k,split,dtype", [
    (1, 128, 32, 256, 1, "bf16"), (2, 128, 64, 128, 1, "bf16"), (3, 64, 16, 512, 2, "fp16"),
    (4, 32, 32, 256, 2, "bf16"), (4, 128, 32, 128, 1, "fp32"), (1, 32, 128, 128, 4, "bf16")])
def test_w4a16_gemv_compiles_for_sm90(rows, group, block_n, block_k, split, dtype):
    """The GEMV's specializations (token rows, a tile of groups, a group of tiles, split K): no
    int-to-float conversion (the exponent trick), the packed words read 16 bytes a thread past
    L2 (evict_first), and one launch writing x's dtype without a K split."""
    constants = dict(GROUP=group, ROWS=rows, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split)
    signature = dict(GEMV_ARGS, x_ptr=f"*{dtype}", scales_ptr=f"*{dtype}",
                     out_ptr=f"*{dtype}" if split == 1 else "*fp32",
                     **{name: "constexpr" for name in constants})
    kernel_fn = w4a16._w4a16_gemv_kernel
    attrs = {(kernel_fn.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in GEMV_ALIGNED}
    source = ASTSource(kernel_fn, signature, constants, attrs)
    kernel = _compile_or_skip(source, num_warps=4, num_stages=1)
    assert kernel.asm["cubin"]
    ptx = kernel.asm["ptx"]
    assert "cvt.rn.f32.s32" not in ptx and "cvt.rn.f32.u32" not in ptx
    assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in ptx


@pytest.mark.parametrize("gate_up,use_dot,split_k", [(False, True, 1), (True, True, 1),
                                                     (False, False, 2)])
def test_small_m_norm_prologue_compiles_for_sm90(gate_up, use_dot, split_k):
    """The add + RMSNorm prologue (prologue.py) then the product: Qwen3-0.6B's qkv and gate/up
    at batch 1 (4 split-K partials of 1024 columns in), its scratch rows stored, a CTA barrier,
    then read back."""
    from compiled_llm.gemm import prologue

    constants = dict(S_IN=4, ROWS=1, K_PAD=1024, BLOCK_M=16 if use_dot else 1, BLOCK_N=64,
                     BLOCK_K=256, SPLIT_K=split_k, EVEN_K=True, USE_DOT=use_dot,
                     PRECISION="tf32", PDL=0, GATE_UP=gate_up)
    signature = {"part_in_ptr": "*fp32", "res_ptr": "*bf16", "nw_ptr": "*bf16",
                 "summed_ptr": "*bf16", "scratch_ptr": "*bf16", "w_ptr": "*bf16",
                 "out_ptr": "*bf16", "part_ptr": "*fp32" if split_k > 1 else "*bf16",
                 "M": "i32", "N": "i32", "K": "i32", "stride_res": "i32", "stride_wn": "i32",
                 "stride_os": "i32", "eps": "fp32", **{name: "constexpr" for name in constants}}
    source = ASTSource(prologue._small_m_norm_kernel, signature, constants, {})
    kernel = _compile_or_skip(source, num_warps=4, num_stages=4)
    ptx = kernel.asm["ptx"]
    assert kernel.asm["cubin"] and "bar.sync" in ptx and "rsqrt" in ptx
    assert ptx.index("st.global") < ptx.rindex("ld.global")


MMA_ARGS = {"qweight_ptr": "*i32", "zeros_ptr": "*u8", "M": "i32", "N": "i32", "K": "i32",
            "stride_xm": "i32", "stride_qn": "i32", "stride_sn": "i32", "stride_zn": "i32",
            "stride_os": "i32", "stride_om": "i32"}


@pytest.mark.parametrize("dtype,block_n,warps,arch", [("bf16", 64, 4, 90), ("bf16", 256, 8, 90),
                                                       ("fp16", 128, 4, 90), ("bf16", 64, 4, 80)])
def test_w4a16_paired_mma_compiles_for_sm90(dtype, block_n, warps, arch):
    """The MMA kernel for 16-bit x: two nibbles a LOP3 and the zero taken off in the pair
    (lop3.b32, fma.rn.*x2), no int-to-float conversion of the weights; Hopper's wgmma on
    sm_90, and the same asm through ptxas for sm_80 (no bf16x2 subtract there)."""
    constants = dict(GROUP=128, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=128, SPLIT_K=1,
                     EXPAND=False, PRECISION="tf32", PAIRED=True, ASM=True)
    signature = dict(MMA_ARGS, x_ptr=f"*{dtype}", scales_ptr=f"*{dtype}", out_ptr=f"*{dtype}",
                     **{name: "constexpr" for name in constants})
    kernel_fn = w4a16._w4a16_kernel
    attrs = {(kernel_fn.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in GEMV_ALIGNED if name in kernel_fn.arg_names}
    source = ASTSource(kernel_fn, signature, constants, attrs)
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": warps, "num_stages": 3})
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_{arch} backend: {err}")
    ptx = kernel.asm["ptx"]
    kind = "bf16" if dtype == "bf16" else "f16"
    assert kernel.asm["cubin"] and ptx.count("lop3.b32") >= 4 and f"fma.rn.{kind}x2" in ptx
    assert "cvt.rn.f32.s32" not in ptx and "cvt.rn.bf16.s32" not in ptx
    assert ("wgmma.mma_async" in ptx) == (arch == 90)
