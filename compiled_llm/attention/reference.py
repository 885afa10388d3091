"""Reference attention backend in plain torch: correct on CPU and GPU, not fast.

Handles a flat batch mixing prefill chunks and decodes: each sequence's queries attend causally
to its cached context (earlier chunks included), with GQA and an optional sliding window.
Without a cache (pooling runs) each sequence attends within its own tokens, causally or not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compiled_llm.attention.kv_quant import dequantize, quantize
from compiled_llm.attention.metadata import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
             kv_scales: torch.Tensor | None = None) -> None:
    """Scatter this step's K/V rows into the paged cache [2, N, bs, Hkv, D] at `slots`
    (an FP8 cache stores rows / kv_scales, copied as bytes: CPU has no FP8 index_copy)."""
    num_rows = slots.shape[0]
    for index, rows in enumerate((k[:num_rows], v[:num_rows])):
        dest = kv_cache[index].view(-1, *rows.shape[1:])
        if kv_scales is not None:
            rows = quantize(rows, kv_scales[index], kv_cache.dtype).view(torch.uint8)
            dest = dest.view(torch.uint8)
        dest.index_copy_(0, slots, rows)


def write_kv_rows(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                  kv_scales: torch.Tensor | None = None) -> None:
    """write_kv of this step's real rows (the first meta.num_actual_tokens)."""
    write_kv(k, v, kv_cache, meta.slot_mapping[:meta.num_actual_tokens], kv_scales)


def _read(kv_cache: torch.Tensor, index: int, blocks: torch.Tensor,
          kv_scales: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """K (index 0) or V rows of `blocks` [..., n] -> [..., n, bs, Hkv, D] as `dtype`."""
    cached = kv_cache[index][blocks]
    return cached if kv_scales is None else dequantize(cached, kv_scales[index], dtype)


def _mask(q_len: int, kv_len: int, window: int, device: torch.device) -> torch.Tensor | None:
    if q_len == 1 and (window <= 0 or kv_len <= window):
        return None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window > 0:
        mask &= k_pos > q_pos - window
    return mask


def alibi_bias(slopes: torch.Tensor | None, q_pos: torch.Tensor,
               k_pos: torch.Tensor) -> torch.Tensor | None:
    """ALiBi's score bias [..., Hq, L, S] in float32: slope_h * (k_pos - q_pos), from q_pos
    [..., L, 1] and k_pos [..., 1, S] (a row's shift leaves its softmax as Bloom's
    slope_h * k_pos leaves it); None without slopes."""
    if slopes is None:
        return None
    return slopes.float().view(-1, 1, 1) * (k_pos - q_pos).float().unsqueeze(-3)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA of q [..., Hq, L, D] over k/v [..., Hkv, S, D] (GQA), mask True where visible;
    softcap > 0: the scores soft-capped first; sinks [Hq]: each head's sink logit joins its
    softmax as a key of value 0 (GPT-OSS); bias [..., Hq, L, S] is added to the (capped)
    scores (ALiBi). All in float32, as transformers' eager paths."""
    if softcap <= 0 and sinks is None and bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # [..., Hq, L, S]
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    v = v.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        # keys no query sees may be unwritten cache rows (NaN): 0 * NaN would reach the output
        v = v.masked_fill(~mask.any(-2)[..., None], 0.0)
    if sinks is None:
        return (scores.softmax(-1) @ v).to(q.dtype)
    sink = sinks.float()[:, None, None].expand(*scores.shape[:-1], 1)  # [..., Hq, L, 1]
    probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    return (probs @ v).to(q.dtype)


def attention_forward(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int,
    causal: bool = True,
    kv_scales: torch.Tensor | None = None,
    write_kv: bool = True,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write K/V into the cache, then attend each sequence's queries over its whole context;
    with kv_cache None, over the sequence's own k/v rows (causal=False: every row sees all).
    kv_scales [2, Hkv]: the cache is FP8, holding rows / scale. write_kv=False: they are in
    the cache already. softcap > 0: scores soft-capped, cap * tanh(score / cap) (Gemma 2);
    sinks [Hq]: per-head sink logits in every softmax (GPT-OSS); alibi_slopes [Hq]: ALiBi's
    per-head slopes (Bloom, MPT)."""
    if kv_cache is None:
        return attend_uncached(q, k, v, meta, scale, sliding_window, causal, softcap, sinks,
                               alibi_slopes)
    if not causal:
        raise ValueError("non-causal attention runs without a KV cache only")
    if write_kv:
        write_kv_rows(k, v, kv_cache, meta, kv_scales)
    if meta.max_query_len == 1:
        return _decode(q, kv_cache, meta, scale, sliding_window, kv_scales, softcap, sinks,
                       alibi_slopes)
    out = torch.zeros_like(q)
    block_size = kv_cache.shape[2]
    query_starts, seq_lens = meta.query_start_loc_cpu.tolist(), meta.seq_lens_cpu.tolist()
    for i, kv_len in enumerate(seq_lens):
        start, end = query_starts[i], query_starts[i + 1]
        blocks = meta.block_tables[i, : (kv_len + block_size - 1) // block_size].long()
        keys = _read(kv_cache, 0, blocks, kv_scales, q.dtype).flatten(0, 1)[:kv_len]  # [L, Hkv, D]
        vals = _read(kv_cache, 1, blocks, kv_scales, q.dtype).flatten(0, 1)[:kv_len]
        mask = _mask(end - start, kv_len, sliding_window, q.device)
        bias = _chunk_alibi(alibi_slopes, end - start, kv_len, q.device)
        attended = sdpa(q[start:end].transpose(0, 1),  # [Hq, Tq, D]
                        keys.transpose(0, 1), vals.transpose(0, 1), mask, scale, softcap, sinks,
                        bias)
        out[start:end] = attended.transpose(0, 1)
    return out


def _chunk_alibi(slopes: torch.Tensor | None, q_len: int, kv_len: int,
                 device: torch.device) -> torch.Tensor | None:
    """alibi_bias of a chunk's q_len queries, the last of a kv_len context."""
    if slopes is None:
        return None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return alibi_bias(slopes, q_pos, torch.arange(kv_len, device=device)[None, :])


def _decode(q, kv_cache, meta: AttentionMetadata, scale: float, window: int,
            kv_scales: torch.Tensor | None, softcap: float = 0.0,
            sinks: torch.Tensor | None = None,
            alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """All-decode batch in one SDPA call: gather each sequence's blocks, mask past its length."""
    num_seqs, block_size = meta.num_seqs, kv_cache.shape[2]
    num_blocks = -(-meta.max_seq_len // block_size)
    table = meta.block_tables[:, :num_blocks].long()  # [B, num_blocks]
    keys = _read(kv_cache, 0, table, kv_scales, q.dtype).flatten(1, 2)  # [B, L, Hkv, D]
    vals = _read(kv_cache, 1, table, kv_scales, q.dtype).flatten(1, 2)
    pos = torch.arange(keys.shape[1], device=q.device)[None, :]
    lens = meta.seq_lens[:, None].long()
    mask = pos < lens
    if window > 0:
        mask &= pos >= lens - window
    out = torch.zeros_like(q)
    bias = alibi_bias(alibi_slopes, (lens - 1)[:, None], pos[:, None])  # [B, Hq, 1, L]
    attended = sdpa(q[:num_seqs].unsqueeze(2),  # [B, Hq, 1, D]
                    keys.transpose(1, 2),  # [B, Hkv, L, D]
                    vals.transpose(1, 2), mask[:, None, None, :], scale, softcap, sinks, bias)
    out[:num_seqs] = attended.squeeze(2)
    return out


def attend_uncached(q, k, v, meta: AttentionMetadata, scale: float, window: int,
                    causal: bool, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                    alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's queries over its own k/v rows (no cache: every sequence is whole).
    Bidirectional batches go through padded_attention, a few SDPA calls, not one per sequence."""
    out = torch.zeros_like(q)
    starts = meta.query_start_loc_cpu.tolist()
    if not causal:
        if softcap or sinks is not None or alibi_slopes is not None:
            raise ValueError("soft-capped scores, attention sinks and ALiBi need causal "
                             "attention")
        padded_attention(q, k, v, starts, scale, out, window)
        return out
    for start, end in zip(starts, starts[1:]):
        attended = sdpa(q[start:end].transpose(0, 1),  # [Hq, L, D]
                        k[start:end].transpose(0, 1), v[start:end].transpose(0, 1),
                        _mask(end - start, end - start, window, q.device), scale, softcap,
                        sinks, _chunk_alibi(alibi_slopes, end - start, end - start, q.device))
        out[start:end] = attended.transpose(0, 1)
    return out


def _window_mask(valid: torch.Tensor, offsets: torch.Tensor, window: int) -> torch.Tensor:
    """[B, 1, L or 1, L] keys each query sees: valid ones, within window of it where set."""
    mask = valid[:, None, None, :]
    if window <= 0:
        return mask
    near = (offsets[:, None] - offsets[None, :]).abs() < window  # [L, L]
    return mask & near[None, None]


def length_groups(lens: list[int], slack: float = 1.25) -> list[list[int]]:
    """Sequence indices grouped by length, shortest first: within a group the longest is at
    most `slack` times the shortest (plus 16 tokens), so padding to it wastes little."""
    groups: list[list[int]] = []
    first = 0
    for index in sorted(range(len(lens)), key=lens.__getitem__):
        if not groups or lens[index] > lens[first] * slack + 16:
            groups.append([])
            first = index
        groups[-1].append(index)
    return groups


def padded_attention(q, k, v, starts: list[int], scale: float, out: torch.Tensor,
                     window: int = 0) -> None:
    """Bidirectional attention of each sequence (rows starts[i]:starts[i+1]) into `out`, one
    SDPA call per length group: rows gathered into [B, H, L, D] with the padded keys masked
    (padded queries are computed and dropped); window > 0: keys window or more away hidden."""
    lens = [end - start for start, end in zip(starts, starts[1:])]
    for group in length_groups(lens):
        longest = max(lens[i] for i in group)
        offsets = torch.arange(longest, device=q.device)
        first = torch.tensor([starts[i] for i in group], device=q.device)[:, None]
        valid = offsets[None, :] < torch.tensor([lens[i] for i in group], device=q.device)[:, None]
        rows = torch.where(valid, first + offsets, first)  # [B, L]; padding reads row 0 again
        attended = F.scaled_dot_product_attention(
            q[rows].transpose(1, 2),  # [B, Hq, L, D]
            k[rows].transpose(1, 2),
            v[rows].transpose(1, 2),
            attn_mask=_window_mask(valid, offsets, window),
            scale=scale,
            enable_gqa=True,
        )
        out[rows[valid]] = attended.transpose(1, 2)[valid]
