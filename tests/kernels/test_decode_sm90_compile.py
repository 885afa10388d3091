"""Compiles the split decode attention kernels for the H200 (sm_90) without a GPU, as
test_sm90_compile does the sampler's: every specialization through TTGIR, PTX and ptxas, and the
one-launch merge's PTX (a gpu-scope acq_rel arrival, partials read at L2) checked."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from compiled_llm.attention.kernels import decode  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)


def compile_decode(direct: bool, merge: bool, fp8: bool, window: bool, pdl: int = 0,
                   split_keys: int = 0, block_n: int = 64, order: bool = False,
                   softcap: float = 0.0, sinks: bool = False, alibi: bool = False):
    """The split decode kernel as sm_90 code: Qwen-like GQA 7, head_dim 128, bf16 queries."""
    kv = "*fp8e4nv" if fp8 else "*bf16"
    signature = dict(q_ptr="*bf16", k_cache_ptr=kv, v_cache_ptr=kv, table_ptr="*i32",
                     seq_lens_ptr="*i32", order_ptr="*i32", out_ptr="*bf16",
                     part_acc_ptr="*fp32", part_ml_ptr="*fp32",
                     scales_ptr="*fp32" if fp8 else "*i32",
                     counter_ptr="*i32", sinks_ptr="*bf16", slopes_ptr="*fp32",
                     qk_scale="fp32", window="i32", num_splits="i32",
                     **{f"stride_{s}": "i32" for s in ("qt", "qh", "ot", "oh", "cb", "cs", "ch",
                                                       "tb")})
    constants = dict(G=7, G_PAD=16, BLOCK_N=block_n, D=128, BS=16, HAS_WINDOW=window, DIRECT=direct,
                     PREC="tf32", FP8=fp8, MERGE=merge, S_PAD=1 if direct else 32,
                     SPLIT_KEYS=split_keys, PDL=pdl, ORDER=order, SOFTCAP=softcap, SINKS=sinks,
                     ALIBI=alibi)
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(decode._decode_split_kernel, signature, constants, {})
    return triton.compile(source, target=SM90, options={"num_warps": 4, "num_stages": 3})


@pytest.mark.parametrize("direct,merge,fp8,window,split_keys,order", [
    (True, False, False, False, 0, True), (False, False, False, True, 0, False),
    (False, True, False, False, 0, True), (False, True, True, True, 0, True),
    (False, True, False, True, 256, False), (False, False, False, False, 256, True)])
def test_decode_split_kernel_compiles_for_sm90(direct, merge, fp8, window, split_keys, order):
    try:
        kernel = compile_decode(direct, merge, fp8, window, split_keys=split_keys, order=order)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    ptx = kernel.asm["ptx"]
    assert kernel.asm["cubin"]
    # the in-launch merge: one gpu-scope acq_rel arrival, partials read past L1
    assert ptx.count("atom.global.gpu.acq_rel.add") == int(merge)
    assert ("ld.global.cg" in ptx) == merge
    assert "griddepcontrol" not in ptx


@pytest.mark.parametrize("fp8", [False, True])
def test_the_batched_tile_compiles_for_sm90(fp8):
    """128-key tiles at head_dim 128 (decode_config's from two sequences on)."""
    from compiled_llm.attention.triton_backend import decode_config

    assert decode_config(128, 1).block_n == 64 and decode_config(128, 2).block_n == 128
    try:
        kernel = compile_decode(False, False, fp8, False, block_n=decode_config(128, 8).block_n)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    assert kernel.asm["cubin"]


@pytest.mark.parametrize("direct", [True, False])
def test_decode_split_kernel_waits_first_under_pdl(direct):
    """Under PDL every program waits for the kernel before (which wrote the KV cache) before
    its first load, and lets the next kernel launch."""
    try:
        ptx = compile_decode(direct, False, False, False, pdl=2).asm["ptx"]
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    wait = ptx.index("griddepcontrol.wait")
    assert wait < ptx.index("ld.global") and wait < ptx.index("griddepcontrol.launch_dependents")


@pytest.mark.parametrize("split_keys", [0, 256])
def test_decode_reduce_kernel_compiles_for_sm90(split_keys):
    constants = dict(S_PAD=32, D=128, HAS_WINDOW=True, SPLIT_KEYS=split_keys, PDL=2)
    signature = dict(part_acc_ptr="*fp32", part_ml_ptr="*fp32", out_ptr="*bf16",
                     seq_lens_ptr="*i32", window="i32", num_splits="i32", stride_ot="i32",
                     stride_oh="i32", **{name: "constexpr" for name in constants})
    source = ASTSource(decode._decode_reduce_kernel, signature, constants, {})
    try:
        kernel = triton.compile(source, target=SM90, options={"num_warps": 4})
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    assert kernel.asm["cubin"]
    ptx = kernel.asm["ptx"]
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


def compile_decode_qk(direct: bool, norms: bool, pdl: int = 0, softcap: float = 0.0,
                      sinks: bool = False, alibi: bool = False):
    """The one-launch decode (QK-norm + RoPE + KV write, then the split) as sm_90 code."""
    from compiled_llm.attention.kernels import decode_qk

    signature = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*fp32",
                     sin_ptr="*fp32", qw_ptr="*bf16", kw_ptr="*bf16", eps="fp32",
                     slot_ptr="*i64", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
                     table_ptr="*i32", seq_lens_ptr="*i32", order_ptr="*i32",
                     out_ptr="*bf16", part_acc_ptr="*fp32", part_ml_ptr="*fp32",
                     counter_ptr="*i32", sinks_ptr="*bf16", slopes_ptr="*fp32",
                     qk_scale="fp32", window="i32", num_splits="i32",
                     **{f"stride_{s}": "i32" for s in ("qt", "qh", "kt", "kh", "vt", "vh", "cos",
                                                       "sin", "ot", "oh", "cb", "cs", "ch",
                                                       "tb")})
    constants = dict(G=2, G_PAD=16, BLOCK_N=64, D=128, BS=16, HKV=8, HAS_WINDOW=False,
                     DIRECT=direct, PREC="tf32", HAS_Q_NORM=norms, HAS_K_NORM=norms,
                     MERGE=not direct, S_PAD=1 if direct else 32,
                     SPLIT_KEYS=0 if direct else 256, PDL=pdl, ORDER=not norms,
                     SOFTCAP=softcap, SINKS=sinks, ALIBI=alibi)
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(decode_qk._decode_qk_split_kernel, signature, constants, {})
    return triton.compile(source, target=SM90, options={"num_warps": 4, "num_stages": 3})


@pytest.mark.parametrize("direct,norms", [(True, True), (False, True), (False, False)])
def test_decode_qk_kernel_compiles_for_sm90(direct, norms):
    """Compiles (the newest key's cache write among its stores); under PDL every program
    waits before its first load."""
    try:
        kernel = compile_decode_qk(direct, norms)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    assert kernel.asm["cubin"] and "st.global" in kernel.asm["ptx"]
    under_pdl = compile_decode_qk(direct, norms, pdl=2).asm["ptx"]
    assert under_pdl.index("griddepcontrol.wait") < under_pdl.index("ld.global")


def test_soft_capped_decode_kernels_compile_for_sm90():
    """Gemma 2's capped scores (cap 50, in the log2 domain) in the split decode kernel and the
    one-launch decode: both compile, the cap's exp2 among their instructions."""
    cap = 50.0 * 1.4426950408889634
    try:
        split = compile_decode(False, True, False, True, softcap=cap)
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    plain = compile_decode(False, True, False, True)
    assert split.asm["ptx"].count("ex2.approx") > plain.asm["ptx"].count("ex2.approx")
    assert compile_decode_qk(False, False, softcap=cap).asm["cubin"]


@pytest.mark.parametrize("option", ["sinks", "alibi"])
def test_decode_kernels_with_head_score_options_compile_for_sm90(option):
    """GPT-OSS's sink logits and ALiBi's slopes (Bloom, MPT) in the split decode kernel and
    the one-launch decode: both compile, the per-head values read among their loads."""
    try:
        split = compile_decode(False, True, False, True, **{option: True})
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    plain = compile_decode(False, True, False, True)
    assert split.asm["ptx"].count("ld.global") > plain.asm["ptx"].count("ld.global")
    assert compile_decode_qk(False, False, **{option: True}).asm["cubin"]
