"""PoolingRunner: runs a model for pooling (embeddings, classification) on one device. A step is
one forward over whole sequences packed flat, with no KV cache anywhere: the attention op
attends within each sequence's own tokens (bidirectionally for encoders). Compiled with the
project's backend like the generate runner; no CUDA graphs (every step is a fresh shape mix).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.config import CompileConfig
from compiled_llm.sample.uploads import upload
from compiled_llm.worker.pooler import class_probs, embedding_head, pool


class PoolingRunner:
    """Owns the model and its compiled forward. Invariant: kv_caches stays empty (nothing is
    cached between or within steps)."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype,
                 compile_cfg: CompileConfig, attn_backend: str = "torch") -> None:
        self.model, self.device, self.dtype = model, device, dtype
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
        flat = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in input_ids])
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
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
    def embed(self, input_ids: list[list[int]], pooling_type: str, normalize: list[bool],
              dimensions: list[int | None]) -> list[list[float]]:
        """One embedding per sequence, with its own normalisation and Matryoshka size."""
        pooled = self.pooled(input_ids, pooling_type).cpu()
        return [embedding_head(row, norm, dims).tolist()
                for row, norm, dims in zip(pooled, normalize, dimensions)]

    @torch.inference_mode()
    def classify(self, input_ids: list[list[int]], pooling_type: str,
                 use_activation: list[bool]) -> list[list[float]]:
        """Class probabilities (or raw logits without activation) per sequence."""
        if not self.can_classify:
            raise ValueError("this model has no classification head")
        logits = self.model.classify(self.pooled(input_ids, pooling_type).to(self.dtype))
        logits = logits.float().cpu()
        return [class_probs(row[None], act)[0].tolist()
                for row, act in zip(logits, use_activation)]

    def shutdown(self) -> None:
        """Drop the compiled forward and the weights (idempotent)."""
        release = getattr(self.forward_fn, "release", None)
        self.forward_fn = self.model = None
        if release is not None:
            release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
