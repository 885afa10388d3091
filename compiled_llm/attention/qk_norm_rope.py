"""`compiled_llm::qk_norm_rope_kv_write`: one attention layer's per-head q/k RMSNorm (optional),
rotate-half RoPE and paged K/V write in one op, the first half of `qk_norm_rope_attention`
(attention/__init__.py). Like attention it reads caches from the forward context and sits
between the compiled pieces. Backends may register fused implementations (also one for whole
all-decode steps); else it runs the reference (the models' math)."""

from __future__ import annotations

import importlib
import os

import torch

from compiled_llm.attention.forward_context import get_forward_context
from compiled_llm.attention.kv_quant import calibrate, is_fp8
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.attention.reference import write_kv_rows

# The graph pass that emits the op is passes/qk_norm_rope.py; the models stay as they are. The
# reference also serves the FP8 cache's calibrating step and runs without caches (pooling).

QK_NORM_ROPE_OP_NAME = "compiled_llm::qk_norm_rope_kv_write"
_FUSED: dict[str, object] = {}
_FUSED_DECODE: dict[str, object] = {}
# =0: all-decode steps take the two-op path too (the write, then attention), for A/B figures
ONE_LAUNCH_DECODE = os.environ.get("COMPILED_LLM_ONE_LAUNCH_DECODE", "1") != "0"
_LAZY = {"triton": "compiled_llm.attention.triton_backend"}


def register_fused_write(backend: str, fused) -> None:
    """Use fused(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache, metadata, kv_scales)
    -> (q_out, k_out) when the context's attention backend is `backend`; it must write the
    rotated k and v of this step's rows exactly as the backend's own write would."""
    _FUSED[backend] = fused


def register_fused_decode(backend: str, fused) -> None:
    """Use fused(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache, metadata, scale,
    sliding_window[, softcap: given only when > 0]) -> out for all-decode steps
    (max_query_len 1) over non-FP8 caches when the context's backend is `backend`: the write
    and the attention of the two-op path in one."""
    _FUSED_DECODE[backend] = fused


def rms_norm_heads(heads: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32, cast back, then scaled (models/layers.py's)."""
    dtype = heads.dtype
    heads_f32 = heads.float()
    heads_f32 = heads_f32 * torch.rsqrt(heads_f32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * heads_f32.to(dtype)


def rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of heads [T, H, D] by cos/sin [T, 1, D] (models/rotary.py's)."""
    cos, sin = cos.to(heads.dtype), sin.to(heads.dtype)
    first_half, second_half = heads.chunk(2, dim=-1)
    return heads * cos + torch.cat([-second_half, first_half], -1) * sin


def qk_norm_rope_ref(q, k, cos, sin, q_weight, k_weight, eps: float):
    """(rotated q, rotated k), each normed first where its weight is given."""
    if q_weight is not None:
        q = rms_norm_heads(q, q_weight, eps)
    if k_weight is not None:
        k = rms_norm_heads(k, k_weight, eps)
    return rotate(q, cos, sin).contiguous(), rotate(k, cos, sin).contiguous()


def reference_fused_write(q, k, v, cos, sin, q_weight, k_weight, eps: float,
                          kv_cache: torch.Tensor, meta: AttentionMetadata,
                          kv_scales: torch.Tensor | None):
    """The unfused math, then the reference backend's write of the rotated k and v."""
    q_out, k_out = qk_norm_rope_ref(q, k, cos, sin, q_weight, k_weight, eps)
    write_kv_rows(k_out, v, kv_cache, meta, kv_scales)
    return q_out, k_out


def _fused_for(backend: str, table: dict | None = None, default=reference_fused_write):
    """backend's entry in table (the fused writes by default), importing a lazy backend first;
    default when it registered none."""
    table = _FUSED if table is None else table
    if backend not in table and backend in _LAZY:
        importlib.import_module(_LAZY[backend])
    return table.get(backend, default)


@torch.library.custom_op(QK_NORM_ROPE_OP_NAME, mutates_args=())
def qk_norm_rope_kv_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, layer_idx: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k/v [T, Hkv, D] (views of the qkv GEMM output), cos/sin [T, 1, D] ->
    (rotated q, rotated k), each normed first where its weight is given; also writes the
    rotated k and v into layer_idx's cache when the context holds caches."""
    ctx = get_forward_context()
    kv_cache = ctx.kv_caches[layer_idx] if ctx.kv_caches else None
    if kv_cache is None:  # pooling runs: attention_no_write attends over the returned k and v
        return qk_norm_rope_ref(q, k, cos, sin, q_weight, k_weight, eps)
    meta = ctx.attn_metadata
    kv_scales = ctx.kv_scales[layer_idx] if is_fp8(kv_cache.dtype) else None
    if kv_scales is not None and ctx.calibrate_kv_scales:  # scales from the rotated rows first
        q_out, k_out = qk_norm_rope_ref(q, k, cos, sin, q_weight, k_weight, eps)
        calibrate(k_out, v, kv_scales, meta.num_actual_tokens, kv_cache.dtype)
        write_kv_rows(k_out, v, kv_cache, meta, kv_scales)
        return q_out, k_out
    fused = _fused_for(ctx.backend)
    return fused(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache, meta, kv_scales)


@qk_norm_rope_kv_write.register_fake
def _qk_norm_rope_kv_write_fake(q, k, v, cos, sin, q_weight, k_weight, eps, layer_idx):
    return q.new_empty(q.shape), k.new_empty(k.shape)  # contiguous, as every impl returns


def fused_decode_for(ctx, kv_cache: torch.Tensor | None, causal: bool):
    """The backend's one-launch decode where this step may take it: an all-decode, causal step
    over a non-FP8 cache; else None (the two-op path: FP8 caches, prefills, pooling)."""
    if not ONE_LAUNCH_DECODE or kv_cache is None or not causal or is_fp8(kv_cache.dtype):
        return None
    if ctx.attn_metadata.max_query_len != 1:
        return None
    return _fused_for(ctx.backend, _FUSED_DECODE, None)
