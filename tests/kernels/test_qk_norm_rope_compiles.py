"""The fused QK-norm + RoPE + KV-write kernel compiles for Hopper (sm_90) without a GPU: Triton's
compiler, not its interpreter, type-checks the kernel (one type per name across branches, casts),
so an error the interpreter lets through shows here on CPU, before the GPU tests run."""

from __future__ import annotations

import inspect

import pytest

from compiled_llm.attention.kernels import kernels_interpreted

pytestmark = pytest.mark.skipif(kernels_interpreted(), reason="the interpreter compiles nothing")


def _compile(dtype: str, cache_dtype: str, fp8: bool, norms: bool, block_h: int,
             pdl: int = 0) -> str:
    """PTX of the kernel for Llama-3-8B / Qwen3 heads (32 q, 8 KV, head_dim 128)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from compiled_llm.attention.kernels.qk_norm_rope import _qk_norm_rope_write_kernel as kernel

    pointers = {name: f"*{dtype}" for name in
                ("q_ptr", "k_ptr", "v_ptr", "qw_ptr", "kw_ptr", "q_out_ptr", "k_out_ptr")}
    pointers.update(cos_ptr="*fp32", sin_ptr="*fp32", slot_ptr="*i64", eps="fp32",
                    fp8_max="fp32", k_cache_ptr=f"*{cache_dtype}",
                    v_cache_ptr=f"*{cache_dtype}", scales_ptr="*fp32" if fp8 else "*i64")
    constants = dict(H=32, HKV=8, D=128, BS=16, BLOCK_H=block_h, HAS_Q_NORM=norms,
                     HAS_K_NORM=norms, FP8=fp8, PDL=pdl)
    signature = {name: "constexpr" if name in constants else pointers.get(name, "i32")
                 for name in inspect.signature(kernel.fn).parameters}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 1 if block_h * 128 <= 512 else 4})
    return compiled.asm["ptx"]


@pytest.mark.parametrize("dtype, cache_dtype, fp8, norms, block_h", [
    ("bf16", "bf16", False, False, 2),  # Llama decode
    ("bf16", "bf16", False, True, 8),  # Qwen3 prefill
    ("bf16", "fp8e4nv", True, True, 2),  # FP8 cache
])
def test_kernel_compiles_for_sm90(dtype, cache_dtype, fp8, norms, block_h):
    assert ".entry" in _compile(dtype, cache_dtype, fp8, norms, block_h)


def test_kernel_waits_first_under_pdl():
    """Under PDL the wait for the qkv GEMM comes before every load and store."""
    ptx = _compile("bf16", "bf16", False, True, 2, pdl=2)
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
