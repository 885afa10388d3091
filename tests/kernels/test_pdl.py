"""Programmatic dependent launch (compiled_llm/gemm/pdl.py): where it is on, and the KV-cache
write kernel's wait before its early return (a program with no slot still waits, so kernels
complete in order), compiled for sm_90 on the CPU."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.gemm import pdl


def test_off_by_default_on_the_cpu_and_by_env(monkeypatch):
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl.level() == 0
    assert not pdl.enabled(torch.device("cuda", 0))  # the switch wins before any device query
    monkeypatch.setenv(pdl.ENV, "2")
    assert pdl.launch_kwargs(torch.device("cpu")) == {"PDL": 0}
    monkeypatch.setenv(pdl.ENV, "yes")
    with pytest.raises(ValueError, match=pdl.ENV):
        pdl.level()


@pytest.mark.skipif(kernels_interpreted(), reason="the interpreter compiles nothing")
def test_write_kv_waits_before_its_early_return():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from compiled_llm.attention.kernels.cache_write import _write_kv_kernel as kernel

    constants = dict(BS=16, H=8, H_PAD=8, D=128, FP8=False, PDL=2)
    pointers = dict(k_ptr="*bf16", v_ptr="*bf16", slot_ptr="*i64", k_cache_ptr="*bf16",
                    v_cache_ptr="*bf16", scales_ptr="*i64", fp8_max="fp32")
    signature = {name: "constexpr" if name in constants else pointers.get(name, "i32")
                 for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
    except (ImportError, KeyError) as err:
        pytest.skip(f"no sm_90 backend: {err}")
    ptx = compiled.asm["ptx"]
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")
