"""Attention metadata: the flat-batch description every attention layer reads in one step.

Built once per step by the runner. Device tensors feed kernels; the host copies let the
reference backend slice per sequence without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class AttentionMetadata:
    """Describes a flat batch of B sequences whose new tokens are packed into T rows.

    Invariants: query_start_loc[-1] == num_actual_tokens <= T; seq_lens[i] counts the tokens
    of sequence i cached after this step (earlier context + this step's query tokens).
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token (padding -> null block)
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: torch.Tensor  # [B+1] int32, host copy
    seq_lens_cpu: torch.Tensor  # [B] int32, host copy
    # [B] int32 or None: the leading decodes (num_leading_decodes) by context, longest first,
    # then the other sequences in place; the decode kernels launch their programs in this order
    decode_order: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        """B, the sequences of the batch (padding sequences included when padded)."""
        return self.seq_lens_cpu.shape[0]

    @cached_property
    def num_leading_decodes(self) -> int:
        """How many sequences at the front have one query token each (the scheduler lists
        running requests first, so in a mixed batch these are its decodes): a backend may run
        them on its decode path and the rest as prefills. Read from the host copy, no sync."""
        query_lens = self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]
        longer = torch.nonzero(query_lens != 1)
        return int(longer[0, 0]) if longer.numel() else int(query_lens.shape[0])
