"""PoolingRunner: runs a model for pooling (embeddings, classification) on one device. A step is
one forward over whole sequences packed flat, no KV cache anywhere: the attention op attends
within each sequence's own tokens (bidirectionally for encoders). Compiled like the generate
runner, no CUDA graphs (every step is a fresh shape mix); a step's rows reach the host in one
non-blocking copy (HostRows), waited for after the caller has launched the next step."""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch
from torch import nn

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.config import CompileConfig
from compiled_llm.sample.uploads import upload
from compiled_llm.worker.pooler import class_prob_groups, embedding_groups, pool


class PoolingRunner:
    """Owns the model and its compiled forward. Invariant: kv_caches stays empty (nothing is
    cached between or within steps)."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype,
                 compile_cfg: CompileConfig, attn_backend: str = "torch",
                 projector: nn.Module | None = None) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.projector = projector  # sentence-transformers' Dense modules (st_dense.py)
        self.attn_backend = attn_backend
        self.kv_caches: list[torch.Tensor] = []
        if compile_cfg.mode == "none":
            self.forward_fn = model
        else:
            from compiled_llm.compile import compile_model

            self.forward_fn = compile_model(model, compile_cfg, dtype)

    @property
    def token_type_shift(self) -> int | None:
        """The bit a token's type goes to in its id (models with token type embeddings), or
        None: the model has no token types."""
        return getattr(self.model, "token_type_shift", None)

    @property
    def can_classify(self) -> bool:
        """Whether the model has a classification head."""
        return hasattr(self.model, "classify")

    @torch.inference_mode()
    def hidden_states(self, input_ids: list[list[int]]) -> torch.Tensor:
        """Per-token hidden states [T, D] of the sequences packed in order."""
        lens = [len(ids) for ids in input_ids]
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        total = int(starts[-1])
        # one pass over the tokens (no array per sequence)
        flat = np.fromiter(chain.from_iterable(input_ids), dtype=np.int64, count=total)
        positions = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], lens)
        device_ids, device_positions = (upload(a, torch.int64, self.device)
                                        for a in (flat, positions))
        starts_cpu = torch.from_numpy(starts)
        lens_cpu = torch.tensor(lens, dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.empty(0, dtype=torch.int64, device=self.device),
            query_start_loc=upload(starts, torch.int32, self.device),
            seq_lens=upload(lens_cpu.numpy(), torch.int32, self.device),
            block_tables=torch.empty(len(lens), 0, dtype=torch.int32, device=self.device),
            num_actual_tokens=int(starts[-1]), max_query_len=max(lens), max_seq_len=max(lens),
            query_start_loc_cpu=starts_cpu, seq_lens_cpu=lens_cpu)
        ctx = ForwardContext(meta, self.kv_caches, self.attn_backend)
        with set_forward_context(ctx):
            return self.forward_fn(device_ids, device_positions)

    @torch.inference_mode()
    def pooled(self, input_ids: list[list[int]], pooling_type: str) -> torch.Tensor:
        """[B, D] float32: each sequence's hidden states pooled."""
        return pool(self.hidden_states(input_ids), [len(i) for i in input_ids], pooling_type)

    @torch.inference_mode()
    def embed_start(self, input_ids: list[list[int]], pooling_type: str, normalize: list[bool],
                    dimensions: list[int | None]) -> HostRows:
        """embed's forward and head launched, the copy to the host under way; the caller
        prepares the next step before it waits on rows()."""
        pooled = self.pooled(input_ids, pooling_type)
        if self.projector is not None:
            pooled = self.projector(pooled)
        return HostRows(embedding_groups(pooled, normalize, dimensions), len(input_ids))

    def embed(self, input_ids: list[list[int]], pooling_type: str, normalize: list[bool],
              dimensions: list[int | None]) -> list[list[float]]:
        """One embedding per sequence, with its own normalisation and Matryoshka size."""
        return self.embed_start(input_ids, pooling_type, normalize, dimensions).rows()

    @torch.inference_mode()
    def classify_start(self, input_ids: list[list[int]], pooling_type: str,
                       use_activation: list[bool]) -> HostRows:
        """classify's forward and head launched, the copy to the host under way."""
        if not self.can_classify:
            raise ValueError("this model has no classification head")
        logits = self.model.classify(self.pooled(input_ids, pooling_type).to(self.dtype))
        return HostRows(class_prob_groups(logits, use_activation), len(input_ids))

    def classify(self, input_ids: list[list[int]], pooling_type: str,
                 use_activation: list[bool]) -> list[list[float]]:
        """Class probabilities (or raw logits without activation) per sequence."""
        return self.classify_start(input_ids, pooling_type, use_activation).rows()

    def shutdown(self) -> None:
        """Drop the compiled forward and the weights (idempotent)."""
        release = getattr(self.forward_fn, "release", None)
        self.forward_fn = self.model = self.projector = None
        if release is not None:
            release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class HostRows:
    """One step's result rows on their way to the host: each group's tensor is copied into
    pinned memory without blocking (CUDA), so the host waits once, in rows(), after it has
    launched the next step. Invariant: the groups' row indices cover 0..count-1 once each."""

    def __init__(self, groups: list[tuple[list[int], torch.Tensor]], count: int) -> None:
        self.count = count
        self.copies = [(rows, _to_host(values)) for rows, values in groups]
        self.done = None
        if any(values.device.type == "cuda" for _, values in groups):
            self.done = torch.cuda.Event()
            self.done.record()

    def rows(self) -> list[list[float]]:
        """Every row as a list of floats, in row order (waits for the copies)."""
        if self.done is not None:
            self.done.synchronize()
        if len(self.copies) == 1:
            return self.copies[0][1].tolist()
        out: list = [None] * self.count
        for rows, host in self.copies:
            for row, values in zip(rows, host.tolist()):
                out[row] = values
        return out


def _to_host(values: torch.Tensor) -> torch.Tensor:
    if values.device.type != "cuda":
        return values
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    return host.copy_(values, non_blocking=True)
