"""Paged attention batches for kernel tests: random block placement, poisoned free blocks.

Free cache blocks (the null block included) hold NaN, so a kernel that reads past a sequence's
length, or through an unused block-table column, turns its output into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.attention.reference import attention_forward


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    kv_cache: torch.Tensor  # [2, N, bs, Hkv, D], context already cached, free blocks NaN
    meta: AttentionMetadata


def _block_table(seq_lens: list[int], block_size: int, gen: torch.Generator):
    need = [-(-s // block_size) for s in seq_lens]
    num_blocks = 1 + sum(need) + 3  # null block + used + a few free ones
    ids = torch.randperm(num_blocks - 1, generator=gen) + 1
    table = torch.zeros(len(seq_lens), max(need, default=0) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = ids[used : used + n]
        used += n
    return table, num_blocks


def _slots(table, ctx_lens, seq_lens, block_size) -> torch.Tensor:
    out = []
    for i, (c, s) in enumerate(zip(ctx_lens, seq_lens)):
        pos = torch.arange(c, s)
        out.append(table[i, pos // block_size].long() * block_size + pos % block_size)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def make_batch(
    q_lens: list[int], ctx_lens: list[int], hq: int, hkv: int, d: int, *,
    block_size: int = 16, dtype: torch.dtype = torch.float32, device: str = "cpu",
    pad_rows: int = 0, seed: int = 0,
) -> PagedBatch:
    """Sequences i with ctx_lens[i] cached tokens and q_lens[i] new ones (0/0: a padded seq)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    table, num_blocks = _block_table(seq_lens, block_size, gen)
    cache = torch.full((2, num_blocks, block_size, hkv, d), float("nan"))
    for i, s in enumerate(seq_lens):
        blocks = table[i, : -(-s // block_size)].long()
        cache[:, blocks] = torch.randn(2, len(blocks), block_size, hkv, d, generator=gen)
    slots = _slots(table, ctx_lens, seq_lens, block_size)
    n = slots.shape[0]
    t = n + pad_rows
    slots = torch.cat([slots, torch.full((pad_rows,), -1, dtype=torch.int64)])
    qkv = torch.randn(t, hq + 2 * hkv, d, generator=gen)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    dev = torch.device(device)
    meta = AttentionMetadata(
        slot_mapping=slots.to(dev), query_start_loc=qsl.to(dev), seq_lens=lens.to(dev),
        block_tables=table.to(dev), num_actual_tokens=n, max_query_len=max(q_lens),
        max_seq_len=max(seq_lens), query_start_loc_cpu=qsl, seq_lens_cpu=lens,
    )
    qkv = qkv.to(device=dev, dtype=dtype)  # q, k, v are strided views, as after a fused qkv_proj
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)
    return PagedBatch(q, k, v, cache.to(device=dev, dtype=dtype), meta)


def reference(batch: PagedBatch, scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference output and written cache, in float32 on a NaN-free copy of the cache."""
    cache = torch.nan_to_num(batch.kv_cache.float(), nan=0.0)
    q, k, v = (x.float() for x in (batch.q, batch.k, batch.v))
    return attention_forward(q, k, v, cache, batch.meta, scale, window), cache


def pad_decode(batch: PagedBatch, num_pad: int) -> PagedBatch:
    """Append padded decode sequences, as a static CUDA-graph batch has them: one dummy query
    row each, seq_len 0, an all-null block-table row, no cache slot."""
    meta, dev = batch.meta, batch.q.device
    b, t = meta.seq_lens.shape[0], batch.q.shape[0]
    qkv = torch.cat([batch.q, batch.k, batch.v], dim=1)
    qkv = torch.cat([qkv, torch.randn(num_pad, *qkv.shape[1:]).to(qkv)])
    q, k, v = qkv.split([batch.q.shape[1], batch.k.shape[1], batch.v.shape[1]], dim=1)
    qsl = torch.arange(b + num_pad + 1, dtype=torch.int32)
    lens = torch.cat([meta.seq_lens_cpu, torch.zeros(num_pad, dtype=torch.int32)])
    table = torch.cat([meta.block_tables.cpu(), meta.block_tables.new_zeros(
        num_pad, meta.block_tables.shape[1]).cpu()])
    slots = torch.cat([meta.slot_mapping.cpu(), torch.full((num_pad,), -1)])
    assert t == b and meta.max_query_len == 1, "pad_decode takes an all-decode batch"
    new = AttentionMetadata(slots.to(dev), qsl.to(dev), lens.to(dev), table.to(dev), t,
                            1, meta.max_seq_len, qsl, lens)
    return PagedBatch(q, k, v, batch.kv_cache, new)


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]


def fp8_batch(batch: PagedBatch, dtype: torch.dtype = torch.float8_e4m3fn,
              seed: int = 0) -> tuple[PagedBatch, torch.Tensor]:
    """The batch with its cache in FP8 (free blocks still NaN) and its per-head scales
    [2, Hkv] (random around amax / 64, so that scaling matters)."""
    from compiled_llm.attention.kv_quant import quantize

    gen = torch.Generator().manual_seed(seed)
    hkv = batch.kv_cache.shape[3]
    scales = (0.02 + 0.06 * torch.rand(2, hkv, generator=gen)).to(batch.q.device)
    cache = torch.stack([quantize(batch.kv_cache[i].flatten(0, 1), scales[i], dtype)
                         .view_as(batch.kv_cache[i]) for i in (0, 1)])
    return PagedBatch(batch.q, batch.k, batch.v, cache, batch.meta), scales


def fp8_reference(batch: PagedBatch, scales: torch.Tensor, scale: float,
                  window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference backend over the FP8 batch (NaN blocks zeroed): output, written cache."""
    cache = batch.kv_cache.clone()
    cache.view(torch.uint8)[cache.float().isnan()] = 0
    q, k, v = (x.float() for x in (batch.q, batch.k, batch.v))
    out = attention_forward(q, k, v, cache, batch.meta, scale, window, kv_scales=scales)
    return out, cache


def dense_attention(batch: PagedBatch, q_lens: list[int], ctx_lens: list[int], window: int,
                    scale: float, cap: float = 0.0, sinks: torch.Tensor | None = None,
                    slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's queries over its whole context (cache rows, then this step's), causal
    with the window, written out in float32: scores capped as cap * tanh(score / cap) where
    cap > 0, each head's sink logit appended to its scores where sinks [Hq] are given, Bloom's
    ALiBi bias slope_h * key position added where slopes [Hq] are."""
    meta, outs, row = batch.meta, [], 0
    block_size = batch.kv_cache.shape[2]
    for index, (q_len, ctx) in enumerate(zip(q_lens, ctx_lens)):
        total = ctx + q_len
        blocks = meta.block_tables[index, : -(-total // block_size)].long()
        keys = batch.kv_cache[0][blocks].flatten(0, 1)[:ctx].clone()  # [ctx, Hkv, D]
        vals = batch.kv_cache[1][blocks].flatten(0, 1)[:ctx].clone()
        keys = torch.cat([keys, batch.k[row:row + q_len]]).transpose(0, 1)  # [Hkv, L, D]
        vals = torch.cat([vals, batch.v[row:row + q_len]]).transpose(0, 1)
        query = batch.q[row:row + q_len].transpose(0, 1)  # [Hq, Tq, D]
        group = query.shape[0] // keys.shape[0]
        keys, vals = keys.repeat_interleave(group, 0), vals.repeat_interleave(group, 0)
        scores = query @ keys.transpose(1, 2) * scale  # [Hq, Tq, L]
        if cap > 0:
            scores = cap * torch.tanh(scores / cap)
        q_pos = torch.arange(ctx, total)[:, None]
        k_pos = torch.arange(total)[None, :]
        if slopes is not None:  # absolute key positions, as Bloom writes it
            scores = scores + slopes[:, None, None] * k_pos.float()
        visible = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window > 0 else True)
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        outs.append((probs @ vals).transpose(0, 1))
        row += q_len
    return torch.cat(outs)
