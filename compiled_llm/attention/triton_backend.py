"""The "triton" attention backend (registered on import): paged KV writes, varlen prefill, decode.

All-decode batches (max_query_len == 1) take the split-K path, which is CUDA-graph capturable;
every other batch runs the varlen prefill kernel (unpaged without a cache: pooling); FP8 caches
take the same kernels. CPU tensors run them through Triton's interpreter (slow: for tests).
"""

from __future__ import annotations

import os

import torch

from compiled_llm.attention import register_backend
from compiled_llm.attention.kernels import (
    DecodeConfig,
    PrefillConfig,
    decode_attention,
    kernels_interpreted,
    prefill_attention,
    varlen_attention,
    write_kv_cache,
)
from compiled_llm.attention.kernels.decode_qk import decode_qk_norm_rope_attention
from compiled_llm.attention.kernels.qk_norm_rope import qk_norm_rope_kv_write
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.attention.qk_norm_rope import register_fused_decode, register_fused_write
from compiled_llm.config_fields import triton_takes_head_dim

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# a mixed batch's leading decodes on the decode kernel (=0: every row on the prefill kernel,
# as before; for A/B measurements)
MIXED_DECODES = os.environ.get("COMPILED_LLM_MIXED_DECODES", "1") != "0"
# decode, opt-in for A/B runs (slower on the H200 at batch 1, docs/benchmarks.md call 65): a
# split per SPLIT_KEYS keys of context (0: every split of the grid), the merge by the last
# split (0: a second kernel merges)
SPLIT_KEYS = int(os.environ.get("COMPILED_LLM_DECODE_SPLIT_KEYS", "0"))
MERGE_IN_LAUNCH = os.environ.get("COMPILED_LLM_DECODE_MERGE_IN_LAUNCH", "0") == "1"
# decode, opt-in for A/B runs: at least this many splits at any batch (with SPLIT_KEYS, the
# long contexts of a large batch split while the short ones take one)
MIN_SPLITS = int(os.environ.get("COMPILED_LLM_DECODE_MIN_SPLITS", "1"))
# decode, for A/B runs: keys per tile at every batch (0: decode_config's choice)
BLOCK_N = int(os.environ.get("COMPILED_LLM_DECODE_BLOCK_N", "0"))
# decode, for A/B runs: =0 launches the programs in batch order, not longest context first
ORDERED = os.environ.get("COMPILED_LLM_DECODE_ORDER", "1") != "0"


def prefill_config(head_dim: int) -> PrefillConfig:
    """Autotune-free defaults for Hopper, by head_dim (register and shared-memory budget)."""
    if head_dim <= 64:
        return PrefillConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    if head_dim <= 256:
        return PrefillConfig(block_m=64, block_n=32, num_warps=8, num_stages=2)
    # Gemma 4's 512-wide heads: (64, 32) tiles in two stages asked 264 KiB of shared memory
    # in float32 (the H200 has 227)
    return PrefillConfig(block_m=32, block_n=16, num_warps=8, num_stages=2)


def decode_config(head_dim: int, num_seqs: int = 1) -> DecodeConfig:
    """Autotune-free decode defaults by head_dim and batch (static per CUDA graph): K/V tiles
    of 8-32 KB, 3 stages in flight. At head_dim 128, 128-key tiles from two sequences on: over
    mixed contexts (100-2,048 keys) the one-launch decode took 6-15% less at batches 8-256
    (H200, `attention_kernels --mixed-sweep`, docs/benchmarks.md); 64 at batch 1, where a
    uniform context took 10% less with them."""
    tiles = dict(num_warps=4, num_stages=3, split_keys=SPLIT_KEYS,
                 merge_in_launch=MERGE_IN_LAUNCH, min_splits=MIN_SPLITS)
    if BLOCK_N:
        return DecodeConfig(block_n=BLOCK_N, **tiles)
    if head_dim <= 64 or (head_dim <= 128 and num_seqs > 1):
        return DecodeConfig(block_n=128, **tiles)
    if head_dim <= 128:
        return DecodeConfig(block_n=64, **tiles)
    return DecodeConfig(block_n=32 if head_dim <= 256 else 16, **{**tiles, "num_stages": 2})


def check_shapes(q: torch.Tensor, kv_cache: torch.Tensor, fp8: bool = False) -> None:
    """Raise ValueError for inputs the kernels do not handle (fp8: the cache is FP8, with
    scales, and need not share q's dtype)."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, cache_head_dim = kv_cache.shape[3], kv_cache.shape[4]
    if not triton_takes_head_dim(head_dim) or head_dim != cache_head_dim:
        raise ValueError(
            f"head_dim must be a power of two >= 16 matching the cache, got {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num query heads {num_q_heads} is not a multiple of num KV heads "
                         f"{num_kv_heads}")
    if q.dtype not in SUPPORTED_DTYPES or (kv_cache.dtype != q.dtype and not fp8):
        raise ValueError(f"q and kv_cache need one dtype of {SUPPORTED_DTYPES}, got "
                         f"q={q.dtype}, kv_cache={kv_cache.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous last dim")
    if q.device.type != "cuda" and not kernels_interpreted():
        raise ValueError(f"the triton attention backend needs CUDA tensors, got {q.device} "
                         "(CPU runs need TRITON_INTERPRET=1 before Triton is imported)")


def triton_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int,
    causal: bool = True,
    kv_scales: torch.Tensor | None = None,  # [2, Hkv] float32: the cache is FP8
    write_kv: bool = True,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [Hq]
    alibi_slopes: torch.Tensor | None = None,  # [Hq] float32
) -> torch.Tensor:
    """Write this step's K/V into the cache (unless write_kv is False), then attend; same
    contract as the reference."""
    score = {"softcap": softcap, "sinks": sinks, "alibi_slopes": alibi_slopes}
    if kv_cache is None:
        return _uncached(q, k, v, meta, scale, sliding_window, causal, **score)
    if not causal:
        raise ValueError("non-causal attention runs without a KV cache only")
    check_shapes(q, kv_cache, kv_scales is not None)
    if write_kv:
        write_kv_cache(k, v, kv_cache, meta.slot_mapping, kv_scales)
    out = torch.empty_like(q)
    head_dim = q.shape[2]
    if meta.max_query_len == 1:
        num_seqs = meta.seq_lens.shape[0]
        decode_attention(q, kv_cache, meta.seq_lens, meta.block_tables, scale, sliding_window,
                         out, decode_config(head_dim, num_seqs), kv_scales=kv_scales,
                         order=_order(meta, num_seqs), **score)
        return _zero_rows_past(out, num_seqs)
    _mixed(q, kv_cache, meta, scale, sliding_window, out, kv_scales, **score)
    return _zero_rows_past(out, meta.num_actual_tokens)


def _order(meta: AttentionMetadata, decodes: int) -> torch.Tensor | None:
    """The launch order of the first `decodes` (leading one-token) sequences, if any."""
    if not ORDERED or meta.decode_order is None:
        return None
    return meta.decode_order[:decodes] if decodes < meta.decode_order.shape[0] else \
        meta.decode_order


def _zero_rows_past(out: torch.Tensor, rows: int) -> torch.Tensor:
    """out with its padded rows (past `rows`) zeroed, as the reference leaves them."""
    if out.shape[0] > rows:
        out[rows:].zero_()
    return out


def _mixed(q, kv_cache, meta: AttentionMetadata, scale: float, sliding_window: int,
           out: torch.Tensor, kv_scales: torch.Tensor | None, **score) -> None:
    """A batch with prompt chunks: its leading one-token sequences (the decodes) on the split
    decode kernel, the rest on the prefill kernel. The prefill kernel's tiles hold up to 128
    query rows, so a decode row in them wastes most of each tile while it reads the whole
    context; decode rows dominate a serving step's KV reads. score: softcap, sinks, ALiBi."""
    head_dim, decodes = q.shape[2], meta.num_leading_decodes if MIXED_DECODES else 0
    if decodes:
        decode_attention(q, kv_cache, meta.seq_lens[:decodes], meta.block_tables[:decodes],
                         scale, sliding_window, out, decode_config(head_dim, decodes),
                         kv_scales=kv_scales, order=_order(meta, decodes), **score)
    if decodes < meta.seq_lens.shape[0]:
        prefill_attention(q, kv_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                          meta.max_query_len, scale, sliding_window, out,
                          prefill_config(head_dim), kv_scales, first_seq=decodes, **score)


def _uncached(q, k, v, meta: AttentionMetadata, scale: float, sliding_window: int,
              causal: bool, **score) -> torch.Tensor:
    """Each sequence over its own k/v rows (pooling runs: nothing is cached)."""
    check_shapes(q, k.unsqueeze(0).unsqueeze(0))  # k's heads and dims stand in for a cache's
    out = torch.empty_like(q)
    varlen_attention(q, k, v, meta.query_start_loc, meta.max_query_len, scale, sliding_window,
                     causal, out, prefill_config(q.shape[2]), **score)
    return _zero_rows_past(out, meta.num_actual_tokens)


def triton_fused_write(q, k, v, cos, sin, q_weight, k_weight, eps: float,
                       kv_cache: torch.Tensor, meta: AttentionMetadata,
                       kv_scales: torch.Tensor | None):
    """qk_norm_rope_kv_write's kernel, after the attention kernels' input checks."""
    check_shapes(q, kv_cache, kv_scales is not None)
    return qk_norm_rope_kv_write(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache, meta,
                                 kv_scales)


def triton_fused_decode(q, k, v, cos, sin, q_weight, k_weight, eps: float,
                        kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                        sliding_window: int, softcap: float = 0.0,
                        sinks: torch.Tensor | None = None,
                        alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """An all-decode step from raw q/k/v over a non-FP8 cache in one launch (and the merge
    where it splits); padded rows past the batch's sequences zeroed, as triton_attention
    leaves them."""
    check_shapes(q, kv_cache)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    num_seqs = meta.seq_lens.shape[0]
    decode_qk_norm_rope_attention(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache,
                                  meta.seq_lens, meta.block_tables, meta.slot_mapping, scale,
                                  sliding_window, out, decode_config(q.shape[2], num_seqs),
                                  order=_order(meta, num_seqs), softcap=softcap, sinks=sinks,
                                  alibi_slopes=alibi_slopes)
    return _zero_rows_past(out, num_seqs)


register_backend("triton", triton_attention)
register_fused_write("triton", triton_fused_write)
register_fused_decode("triton", triton_fused_decode)
