"""The attention custom ops: the opaque ops of every model graph.

`compiled_llm::attention` writes this step's K/V into the paged cache (none: pooling runs) and
attends over the flat batch; `attention_no_write` attends only (qk_norm_rope.py's op wrote K/V);
`qk_norm_rope_attention` does both from raw q/k/v. The compiler sees pure ops, splits there."""

from __future__ import annotations

import importlib

import torch

from compiled_llm.attention.forward_context import get_forward_context
from compiled_llm.attention.kv_quant import calibrate, is_fp8
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.attention.reference import attention_forward

__all__ = ["AttentionMetadata", "attention", "attention_no_write", "qk_norm_rope_attention",
           "ATTENTION_OP_NAME", "QK_NORM_ROPE_ATTENTION_OP_NAME",
           "ATTENTION_NO_WRITE_OP_NAME", "get_backend", "register_backend"]

ATTENTION_OP_NAME = "compiled_llm::attention"
ATTENTION_NO_WRITE_OP_NAME = "compiled_llm::attention_no_write"
QK_NORM_ROPE_ATTENTION_OP_NAME = "compiled_llm::qk_norm_rope_attention"
_BACKENDS = {"torch": attention_forward}
# imported on first use: importing Triton costs time and the torch backend needs none of it
_LAZY_BACKENDS = {"triton": "compiled_llm.attention.triton_backend"}


def register_backend(name: str, forward) -> None:
    """Add an attention implementation selectable through ForwardContext.backend; forward
    has the reference's signature (q, k, v, kv_cache, metadata, scale, sliding_window, causal,
    kv_scales, write_kv, softcap, sinks, alibi_slopes: the last three only where set);
    kv_cache is None when the context holds no caches, kv_scales [2, Hkv] is given for FP8
    caches only, write_kv=False: this step's K/V are in the cache already."""
    _BACKENDS[name] = forward


def get_backend(name: str):
    """The attention implementation registered as `name` (lazy backends import on first use)."""
    if name not in _BACKENDS and name in _LAZY_BACKENDS:
        importlib.import_module(_LAZY_BACKENDS[name])
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; have {sorted(_BACKENDS)}")
    return _BACKENDS[name]


@torch.library.custom_op(ATTENTION_OP_NAME, mutates_args=())
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int, scale: float,
    sliding_window: int, causal: bool = True, softcap: float = 0.0,
    sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; also writes k/v into layer_idx's cache
    when the context holds caches (none: attention within each sequence's own tokens).
    softcap > 0: scores soft-capped, softcap * tanh(score / softcap) (Gemma 2); sinks [Hq]:
    each head's learned sink logit joins its softmax as a key of value 0 (GPT-OSS);
    alibi_slopes [Hq] float32: slope_h * (key pos - query pos) joins each score (ALiBi)."""
    return _attend(q, k, v, layer_idx, scale, sliding_window, causal, True, softcap, sinks,
                   alibi_slopes)


@attention.register_fake
def _attention_fake(q, k, v, layer_idx, scale, sliding_window, causal=True, softcap=0.0,
                    sinks=None, alibi_slopes=None):
    return torch.empty_like(q)


@torch.library.custom_op(ATTENTION_NO_WRITE_OP_NAME, mutates_args=())
def attention_no_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int, scale: float,
    sliding_window: int, causal: bool = True, softcap: float = 0.0,
    sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """`attention` whose K/V write (and FP8 calibration) already ran: the fused
    qk_norm_rope_kv_write op put this step's rows into the cache. k/v are still read where the
    context holds no caches (pooling runs attend over them)."""
    return _attend(q, k, v, layer_idx, scale, sliding_window, causal, False, softcap, sinks,
                   alibi_slopes)


@attention_no_write.register_fake
def _attention_no_write_fake(q, k, v, layer_idx, scale, sliding_window, causal=True,
                             softcap=0.0, sinks=None, alibi_slopes=None):
    return torch.empty_like(q)


def score_options(softcap: float, sinks: torch.Tensor | None,
                  alibi_slopes: torch.Tensor | None = None) -> dict:
    """The backends' keyword arguments for softcap, sinks and ALiBi, each only where set: a
    registered backend without them serves every model that does not use them."""
    return {**({"softcap": softcap} if softcap else {}),
            **({"sinks": sinks} if sinks is not None else {}),
            **({"alibi_slopes": alibi_slopes} if alibi_slopes is not None else {})}


def _attend(q, k, v, layer_idx: int, scale: float, sliding_window: int, causal: bool,
            write_kv: bool, softcap: float, sinks: torch.Tensor | None,
            alibi_slopes: torch.Tensor | None) -> torch.Tensor:
    ctx = get_forward_context()
    forward = get_backend(ctx.backend)
    kv_cache = ctx.kv_caches[layer_idx] if ctx.kv_caches else None
    extra = {"write_kv": write_kv, **score_options(softcap, sinks, alibi_slopes)}
    if kv_cache is None or not is_fp8(kv_cache.dtype):
        return forward(q, k, v, kv_cache, ctx.attn_metadata, scale, sliding_window, causal,
                       **extra)
    kv_scales = ctx.kv_scales[layer_idx]
    if ctx.calibrate_kv_scales and write_kv:
        calibrate(k, v, kv_scales, ctx.attn_metadata.num_actual_tokens, kv_cache.dtype)
    return forward(q, k, v, kv_cache, ctx.attn_metadata, scale, sliding_window, causal,
                   kv_scales=kv_scales, **extra)


# registers compiled_llm::qk_norm_rope_kv_write with the attention ops (a stored split graph
# calls it by name)
from compiled_llm.attention.qk_norm_rope import (  # noqa: E402
    fused_decode_for,
    qk_norm_rope_kv_write,
)


@torch.library.custom_op(QK_NORM_ROPE_ATTENTION_OP_NAME, mutates_args=())
def qk_norm_rope_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, layer_idx: int,
    scale: float, sliding_window: int, causal: bool = True, softcap: float = 0.0,
    sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """qk_norm_rope_kv_write's inputs -> attention's output [T, H, D]: q and k normed (where a
    weight is given) and rotated, k and v written into layer_idx's cache, then attended as
    `attention` attends; an all-decode step on a backend with a fused decode runs it in one."""
    ctx = get_forward_context()
    kv_cache = ctx.kv_caches[layer_idx] if ctx.kv_caches else None
    fused = fused_decode_for(ctx, kv_cache, causal)
    if fused is not None:
        return fused(q, k, v, cos, sin, q_weight, k_weight, eps, kv_cache, ctx.attn_metadata,
                     scale, sliding_window, **score_options(softcap, sinks, alibi_slopes))
    q_out, k_out = qk_norm_rope_kv_write(q, k, v, cos, sin, q_weight, k_weight, eps, layer_idx)
    return attention_no_write(q_out, k_out, v, layer_idx, scale, sliding_window, causal,
                              softcap, sinks, alibi_slopes)


@qk_norm_rope_attention.register_fake
def _qk_norm_rope_attention_fake(q, k, v, cos, sin, q_weight, k_weight, eps, layer_idx, scale,
                                 sliding_window, causal=True, softcap=0.0, sinks=None,
                                 alibi_slopes=None):
    return q.new_empty(q.shape)

