"""Tensor-parallel layers, made by swapping the class of a built module (its parameter names
stay the checkpoint's): row-parallel linears and blocks whose output is all-reduced, RMSNorms
over heads split across ranks, the vocab-parallel embedding (masked lookup + all-reduce) and
the vocab-parallel LM head (local logits all-gathered). The collectives are functional
(c10d_functional), so Dynamo traces them in fullgraph."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.layers import Float32ScaleRMSNorm

C10D = torch.ops._c10d_functional  # the ops torch.distributed._functional_collectives wraps


def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum x over the group: functional all_reduce + wait_tensor, the pair the all-reduce +
    RMSNorm pass matches."""
    return C10D.wait_tensor(C10D.all_reduce(x, "sum", group_name))


def all_gather(x: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
    """x [N, ...] of every rank stacked in rank order: [world_size * N, ...]."""
    return C10D.wait_tensor(C10D.all_gather_into_tensor(x.contiguous(), world_size, group_name))


class RowParallelLinear(nn.Linear):
    """A linear holding a slice of the input features: the partial products are summed over
    the group, then the (unsharded) bias is added once."""

    group_name: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K/tp] -> [..., N], the same on every rank."""
        out = all_reduce(F.linear(x, self.weight), self.group_name)
        return out if self.bias is None else out + self.bias


@functools.cache
def reduced_class(cls: type[nn.Module]) -> type[nn.Module]:
    """cls with its output all-reduced (a block whose parts each hold a slice: the routed
    experts and the shared expert of a MoE block)."""

    def forward(self, *args, **kwargs):
        return all_reduce(cls.forward(self, *args, **kwargs), self.group_name)

    return type(f"Reduced{cls.__name__}", (cls,), {"forward": forward,
                                                   "__doc__": f"{cls.__name__}, all-reduced."})


class HeadsParallelRMSNorm(Float32ScaleRMSNorm):
    """Float32ScaleRMSNorm over a projection whose heads are split across ranks (OLMo 2's
    q_norm / k_norm): the mean square is averaged over the group, each rank's mean over its own
    equal width (a KV head replicated on r ranks counts r times in the sum and the width, so
    the mean stays the whole projection's)."""

    group_name: str
    world_size: int

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., dim / tp] -> the same shape and dtype."""
        hidden_f32 = hidden.float()
        mean_sq = all_reduce(hidden_f32.pow(2).mean(-1, keepdim=True), self.group_name)
        normed = hidden_f32 * torch.rsqrt(mean_sq / self.world_size + self.eps)
        weight = self.weight.float()
        scaled = normed * (self.offset + weight) if self.offset else weight * normed
        return scaled.to(hidden.dtype)


class VocabParallelEmbedding(nn.Embedding):
    """Rows [vocab_start, vocab_start + num_embeddings) of the table: ids outside them read
    zeros, and the sum over the group is every id's row."""

    group_name: str
    vocab_start: int

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, hidden], the same on every rank."""
        local = input_ids - self.vocab_start
        inside = (local >= 0) & (local < self.num_embeddings)
        rows = F.embedding(torch.where(inside, local, 0), self.weight)
        return all_reduce(rows * inside.unsqueeze(-1).to(rows.dtype), self.group_name)


@functools.cache
def vocab_parallel_class(cls: type[nn.Embedding]) -> type[nn.Embedding]:
    """VocabParallelEmbedding under a model's own embedding class (Granite's scaled one): its
    forward's super() call reaches the parallel lookup, so what it adds is kept."""
    if cls is nn.Embedding or issubclass(cls, VocabParallelEmbedding):
        return VocabParallelEmbedding if cls is nn.Embedding else cls
    return type(f"VocabParallel{cls.__name__}", (cls, VocabParallelEmbedding), {})


class ParallelLMHead(nn.Linear):
    """The LM head over this rank's vocab rows; the logits of the rows asked for (only those
    that sample) are gathered from every rank into [N, vocab] in vocab order (the padded rows
    past vocab_size, where the ranks cannot split it evenly, dropped)."""

    group_name: str
    world_size: int
    vocab_size: int

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], the same on every rank."""
        local = F.linear(hidden, self.weight, self.bias)  # [N, vocab/tp]
        gathered = all_gather(local, self.world_size, self.group_name)
        rows, part = local.shape
        # [tp, N, part] -> [N, tp * part], spelled out: N may be 0 (a step none of whose rows
        # samples)
        return gathered.view(self.world_size, rows, part).transpose(0, 1).reshape(
            rows, self.world_size * part)[:, :self.vocab_size]
