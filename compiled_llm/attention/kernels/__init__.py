"""Triton kernels of the attention op: KV-cache writes, varlen paged prefill, split-K decode,
unpaged varlen attention (pooling runs, causal or not)."""

from compiled_llm.attention.kernels.cache_write import write_kv_cache
from compiled_llm.attention.kernels.decode import DecodeConfig, choose_num_splits, decode_attention
from compiled_llm.attention.kernels.prefill import (
    PrefillConfig,
    prefill_attention,
    varlen_attention,
)

__all__ = [
    "DecodeConfig", "PrefillConfig", "choose_num_splits", "decode_attention",
    "kernels_interpreted", "prefill_attention", "varlen_attention", "write_kv_cache",
]


def kernels_interpreted() -> bool:
    """True when Triton's interpreter runs these kernels (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.jit import JITFunction

    from compiled_llm.attention.kernels.cache_write import _write_kv_kernel

    return not isinstance(_write_kv_kernel, JITFunction)
