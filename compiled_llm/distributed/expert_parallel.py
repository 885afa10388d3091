"""Expert parallelism (enable_expert_parallel): each tensor-parallel rank holds num_experts /
world whole experts (one contiguous range), the router replicated. A dispatcher sends tokens to
their experts' ranks and the outputs back; under tensor parallelism every rank holds every
token, so dispatch maps ids to local experts and combine is the block's all-reduce. An
all-to-all dispatcher (tokens sent only where their experts are) implements the same methods."""

from __future__ import annotations

import functools
from typing import NamedTuple, Protocol

import torch
from torch import nn

from compiled_llm.models.moe import ExpertWeight, FusedMoE


class Dispatched(NamedTuple):
    """The tokens one rank's experts run: hidden [T', H], topk_weights and local ids [T', K]
    (id num_local: an expert of another rank, which the fused MoE op skips)."""

    hidden: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor


class MoeDispatcher(Protocol):
    """How routed tokens reach the rank of each expert and come back."""

    def dispatch(self, hidden: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> Dispatched:
        """Global routing of this rank's tokens -> the tokens its local experts run."""

    def combine(self, expert_out: torch.Tensor) -> torch.Tensor:
        """This rank's expert outputs -> its tokens' outputs (summed over ranks, or partial
        sums that the MoE block's all-reduce adds up)."""


class AllReduceDispatcher:
    """Tokens replicated on every rank (tensor parallelism): dispatch keeps all of them and
    masks the slots of other ranks' experts; combine returns the partial sum, which the MoE
    block's all-reduce (the one tensor parallelism does anyway) adds over the ranks."""

    def __init__(self, expert_start: int, num_local: int) -> None:
        self.expert_start, self.num_local = expert_start, num_local

    def dispatch(self, hidden: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> Dispatched:
        """Local ids of this rank's experts, num_local for every other expert."""
        local = topk_ids - self.expert_start
        mine = (local >= 0) & (local < self.num_local)
        return Dispatched(hidden, topk_weights, torch.where(mine, local, self.num_local))

    def combine(self, expert_out: torch.Tensor) -> torch.Tensor:
        """The partial sum as is: the block's all-reduce completes it."""
        return expert_out


DISPATCHERS: dict[str, type] = {"allreduce": AllReduceDispatcher}


class ExpertParallel:
    """Mixin for an experts module of the fused-MoE contract holding experts [expert_start,
    expert_start + num_local) of the layer's; routing ids stay global until the dispatcher
    maps them."""

    dispatcher: MoeDispatcher

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        """Dispatch, this rank's experts, combine."""
        local = self.dispatcher.dispatch(hidden, topk_weights, topk_ids)
        return self.dispatcher.combine(super().forward(*local))


class ExpertParallelMoE(ExpertParallel, FusedMoE):
    """FusedMoE holding one rank's whole experts."""


@functools.cache
def expert_parallel_class(cls: type[nn.Module]) -> type[nn.Module]:
    """cls with ExpertParallel's forward (one class per experts type)."""
    return type(f"ExpertParallel{cls.__name__}", (ExpertParallel, cls), {})


def expert_parallel_names(model: nn.Module) -> dict[str, MoeDispatcher]:
    """Each expert-parallel experts module's name and dispatcher."""
    return {name: module.dispatcher for name, module in model.named_modules()
            if isinstance(module, ExpertParallel)}


def keep_dispatchers(model: nn.Module, dispatchers: dict[str, MoeDispatcher]) -> None:
    """Experts a load-time swap replaced (block-FP8 ones over the same local experts) get
    their expert-parallel dispatch back."""
    for name, dispatcher in dispatchers.items():
        module = model.get_submodule(name)
        if not isinstance(module, ExpertParallel):
            module.__class__ = expert_parallel_class(type(module))
            module.dispatcher = dispatcher


def check_expert_parallel(config, world: int) -> None:
    """ValueError naming enable_expert_parallel unless `world` ranks split the model's experts
    evenly (a dense model has none to split)."""
    moe = getattr(config, "moe", None)
    if moe is None:
        raise ValueError("enable_expert_parallel: the model has no mixture-of-experts layers")
    if moe.num_experts % world:
        raise ValueError(f"enable_expert_parallel: tensor_parallel_size {world} must divide "
                         f"num_experts {moe.num_experts}")


def shard_experts(experts: FusedMoE, rank: int, world: int) -> None:
    """Keep experts [rank * E/world, (rank + 1) * E/world) whole (meta parameters resized)."""
    num_local = experts.num_experts // world
    _, double_inter, hidden = experts.w13_weight.shape
    for name, shape in (("w13_weight", (num_local, double_inter, hidden)),
                        ("w2_weight", (num_local, hidden, double_inter // 2))):
        setattr(experts, name, nn.Parameter(torch.empty(shape, device="meta"),
                                            requires_grad=False))
    experts.__class__ = ExpertParallelMoE
    experts.num_experts = num_local
    experts.dispatcher = AllReduceDispatcher(rank * num_local, num_local)


def local_weight_names(model: nn.Module) -> None:
    """Map checkpoint expert tensors to this rank's local experts and skip the others'
    (an instance-level weight_name over the model class's)."""
    dispatchers = expert_parallel_names(model)  # by module: its weights, scales, biases
    global_name = model.weight_name

    def weight_name(hf_name: str) -> str | ExpertWeight | None:
        target = global_name(hf_name)
        owner = target.name.rpartition(".")[0] if isinstance(target, ExpertWeight) else None
        if owner not in dispatchers:
            return target
        local = target.expert - dispatchers[owner].expert_start
        if not 0 <= local < dispatchers[owner].num_local:
            return None  # another rank's expert
        return target._replace(expert=local)

    model.weight_name = weight_name
