"""Attention metadata: the flat-batch description every attention layer reads in one step.

Built once per step by the runner. Device tensors feed kernels; the host copies let the
reference backend slice per sequence without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def num_seqs(self) -> int:
        """B, the sequences of the batch (padding sequences included when padded)."""
        return self.seq_lens_cpu.shape[0]
