"""The Triton kernel of `compiled_llm::l2_prefetch` (prefetch.py): Hopper's bulk L2 prefetch of
a byte range in fixed chunks, issued from up to one program per SM. Imported on first launch."""

from __future__ import annotations

import triton
import triton.language as tl

LANES = 128  # chunks a program issues at once: one per thread of 4 warps


@triton.jit
def _l2_prefetch_kernel(base_ptr, n_chunks, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Each program issues chunks program_id*LANES + lane, then one grid's worth further on;
    lanes past the end repeat the last chunk (a prefetch has no effect but its reads)."""
    lanes = tl.arange(0, LANES)
    sizes = tl.full([LANES], CHUNK, tl.int32)
    step = tl.num_programs(0) * LANES
    for start in range(tl.program_id(0) * LANES, n_chunks, step):
        chunk = tl.minimum(start + lanes, n_chunks - 1).to(tl.int64)
        tl.inline_asm_elementwise(
            "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
            [base_ptr + chunk * CHUNK, sizes], dtype=tl.int32, is_pure=False, pack=1)


def launch_l2_prefetch(data, n_chunks: int, chunk_bytes: int, sm_count: int) -> None:
    """Prefetch data's (a uint8 CUDA tensor) first n_chunks chunks of chunk_bytes into L2."""
    grid = (min(sm_count, triton.cdiv(n_chunks, LANES)),)
    _l2_prefetch_kernel[grid](data, n_chunks, CHUNK=chunk_bytes, LANES=LANES, num_warps=4)
