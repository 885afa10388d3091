"""Fused QK-norm + RoPE + KV write (issue 14, item 2): decode tokens/s at batch 1, 8 and 32 with
the fused attention prologue (one `qk_norm_rope_kv_write` kernel ahead of attention, which then
only attends) against the unfused one (`passes={"enable_qk_norm_rope_kv_write": false}`: norms
and RoPE in the compiled piece, the write inside attention), CUDA graphs on, async scheduling
(the default), each engine in its own process. Llama-3-8B has no q/k norm; Qwen3-0.6B has.

    python -m benchmarks.qk_norm_rope --checkpoint-dir /tmp/ckpt        # llama3-8b, qwen3-0.6b
    python -m benchmarks.qk_norm_rope --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

from benchmarks.common import decode_pair_main, fused_pair_rows

OFF = {"enable_qk_norm_rope_kv_write": False}
ON = {"enable_qk_norm_rope_kv_write": True}  # the default since call 60


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: fused and unfused tok/s and their ratio."""
    return fused_pair_rows(shape, args, OFF, ON)


def main() -> None:
    decode_pair_main("qk_norm_rope", __doc__, "Fused QK-norm + RoPE + KV write",
                     ["llama3-8b", "qwen3-0.6b"], run_shape, [1, 8, 32], 128, 256)


if __name__ == "__main__":
    main()
