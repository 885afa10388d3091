"""moe_align_block_size: every routed entry once, each block one expert, padding marked, the
rows in use counted on device, and no host sync (only static-shape torch ops)."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.moe.kernels.align import max_padded_rows, moe_align_block_size
from tests.utils import HostSyncWatch


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m",
                         [(1, 8, 2, 16), (5, 4, 2, 4), (37, 8, 3, 16), (64, 3, 1, 8)])
def test_entries_grouped_by_expert_and_padded(num_tokens, num_experts, top_k, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, -1).indices
    with HostSyncWatch() as watch:
        routing = moe_align_block_size(ids, block_m, num_experts)
    assert watch.calls == []
    entries = num_tokens * top_k
    sorted_ids, expert_ids = routing.sorted_ids, routing.expert_ids
    assert sorted_ids.numel() == max_padded_rows(entries, num_experts, block_m)
    used = int(routing.num_post_padded)
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())
    real = sorted_ids[sorted_ids < entries]
    assert sorted(real.tolist()) == list(range(entries))  # each entry exactly once
    assert (sorted_ids[used:] == entries).all()
    flat = ids.flatten()
    for block in range(used // block_m):
        rows = sorted_ids[block * block_m:(block + 1) * block_m]
        rows = rows[rows < entries].long()
        assert rows.numel() > 0 and (flat[rows] == expert_ids[block]).all()
        assert rows.tolist() == sorted(rows.tolist())  # token order within an expert
    assert expert_ids[: used // block_m].tolist() == sorted(expert_ids[: used // block_m].tolist())
