"""Compile the attention kernels offline for Hopper (sm_90, no GPU needed) at the default tile
configs and print what ptxas made of them: registers, stack (spills), shared memory, and how many
wgmma / mma.sync / cp.async instructions the PTX holds (wgmma: the Hopper tensor-core path;
cp.async: loads pipelined across num_stages).

    python -m benchmarks.attention_kernels_sm90 [--head-dims 64 128] [--gqa 4]

Arguments are specialized as the JIT does at run time for aligned tensors (pointers and strides
divisible by 16; the block-table row stride is not assumed to be).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.common import print_table
from compiled_llm.attention.kernels.cache_write import _write_kv_kernel
from compiled_llm.attention.kernels.decode import _decode_reduce_kernel, _decode_split_kernel
from compiled_llm.attention.kernels.prefill import _prefill_kernel
from compiled_llm.attention.triton_backend import decode_config, prefill_config

_INDEX_PTRS = {"qsl_ptr", "seq_lens_ptr", "table_ptr", "counter_ptr"}
_FP32_PTRS = {"part_acc_ptr", "part_ml_ptr"}


def _signature(kernel, dtype: str, constexprs: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, p in enumerate(kernel.params):
        name = p.name
        if p.is_constexpr:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = ("*i32" if name in _INDEX_PTRS else "*i64" if name == "slot_ptr"
                         else "*fp32" if name in _FP32_PTRS else f"*{dtype}")
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
        if name.endswith("_ptr") or (name.startswith("stride") and name != "stride_tb"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _resources(cubin: bytes) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    found = dict(re.findall(r"(REG|STACK):(\d+)", out))
    return {"regs": int(found.get("REG", -1)), "stack": int(found.get("STACK", -1))}


def compile_row(name: str, kernel, constexprs: dict, dtype: str, warps: int, stages: int,
                arch: int) -> dict:
    """Compile one kernel variant for `arch` and summarize its PTX and resource usage."""
    sig, attrs = _signature(kernel, dtype, constexprs)
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    row = {"kernel": name, "warps": warps, "stages": stages}
    try:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                           options={"num_warps": warps, "num_stages": stages})
    except Exception as e:  # report and keep going: one bad config should not hide the rest
        return {**row, "error": f"{type(e).__name__}: {str(e)[:120]}"}
    ptx = k.asm["ptx"]
    return {**row, **_resources(k.asm["cubin"]), "smem_KB": k.metadata.shared / 1024,
            "wgmma": ptx.count("wgmma.mma_async"), "mma.sync": len(re.findall(r"mma\.sync", ptx)),
            "cp.async": len(re.findall(r"cp\.async", ptx))}


def variants(head_dim: int, gqa: int):
    """(name, kernel, constexprs, warps, stages) at the backend's default configs."""
    pc, dc = prefill_config(head_dim), decode_config(head_dim)
    bm = max(pc.block_m, triton.next_power_of_2(gqa), 16)
    for window in (False, True):
        yield (f"prefill d{head_dim} g{gqa} window={window}", _prefill_kernel,
               dict(G=gqa, BLOCK_Q=bm // gqa, BLOCK_M=bm, BLOCK_N=pc.block_n, D=head_dim, BS=16,
                    HAS_WINDOW=window, PREC="tf32"), pc.num_warps, pc.num_stages)
    for direct, merge in ((False, True), (False, False), (True, False)):
        yield (f"decode d{head_dim} g{gqa} direct={direct} merge={merge}", _decode_split_kernel,
               dict(G=gqa, G_PAD=max(16, triton.next_power_of_2(gqa)), BLOCK_N=dc.block_n,
                    D=head_dim, BS=16, HAS_WINDOW=False, DIRECT=direct, PREC="tf32",
                    MERGE=merge, S_PAD=1 if direct else 32),
               dc.num_warps, dc.num_stages)
    yield (f"decode reduce d{head_dim}", _decode_reduce_kernel, dict(S_PAD=32, D=head_dim), 4, 1)
    yield (f"cache write d{head_dim}", _write_kv_kernel, dict(BS=16, H=8, H_PAD=8, D=head_dim),
           4, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--gqa", type=int, default=4)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    rows = [compile_row(*v[:3], args.dtype, *v[3:], args.arch)
            for d in args.head_dims for v in variants(d, args.gqa)]
    print_table(rows, f"Attention kernels compiled for sm_{args.arch} ({args.dtype}), triton "
                      f"{triton.__version__}")


if __name__ == "__main__":
    main()
