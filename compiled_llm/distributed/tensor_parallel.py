"""The tensor-parallel transform (gpt-fast's tp.py shape, from outside the model): on a model
built with meta parameters, q/k/v and gate/up (fused: each part's rows) are sharded by rows,
o/down by columns (outputs all-reduced), each expert's intermediate dim too (the MoE block
all-reduced), embedding and LM head by vocab; a module with shard_for_tp(sharder, prefix)
shards itself. The plan names the slices of each checkpoint tensor a rank reads."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from compiled_llm.distributed.expert_parallel import (
    check_expert_parallel,
    local_weight_names,
    shard_experts,
)
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.shards import FusedShard, PaddedShard, Shard, ZeroShard
from compiled_llm.distributed.tp_layers import (
    HeadsParallelRMSNorm,
    ParallelLMHead,
    RowParallelLinear,
    reduced_class,
    vocab_parallel_class,
)
from compiled_llm.models.layers import Float32ScaleRMSNorm, cast_model, param_dtype


@dataclass(frozen=True)
class HeadLayout:
    """One rank's attention heads: its query heads and the KV heads they read."""

    num_heads: int
    num_kv_heads: int
    first_kv_head: int


def head_layout(num_heads: int, num_kv_heads: int, rank: int, world: int) -> HeadLayout:
    """Query heads split evenly; KV heads split evenly, or, when there are fewer KV heads than
    ranks, each rank holds the one KV head its query heads read (replicated, as vLLM does)."""
    if num_heads % world:
        raise ValueError(f"tensor_parallel_size {world} must divide num_attention_heads "
                         f"{num_heads}")
    if num_kv_heads >= world:
        if num_kv_heads % world:
            raise ValueError(f"tensor_parallel_size {world} must divide num_key_value_heads "
                             f"{num_kv_heads} (or be a multiple of it)")
        per_rank = num_kv_heads // world
        return HeadLayout(num_heads // world, per_rank, rank * per_rank)
    if world % num_kv_heads:
        raise ValueError(f"tensor_parallel_size {world} must be a multiple of "
                         f"num_key_value_heads {num_kv_heads} (or divide it)")
    return HeadLayout(num_heads // world, 1, rank // (world // num_kv_heads))


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules with every parameter on the meta device (buffers stay where they are
    made): the transform sizes them per rank before any memory is taken for them."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _resize(module: nn.Module, name: str, shape: tuple[int, ...]) -> None:
    setattr(module, name, nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False))


class _Sharder:
    """Walks the model once, resizing parameters and recording each one's Shard."""

    def __init__(self, model: nn.Module, tp: TPGroup, expert_parallel: bool = False) -> None:
        self.model, self.tp, self.plan, self.expert_parallel = model, tp, {}, expert_parallel
        cfg = model.config
        self.heads = head_layout(cfg.num_attention_heads, cfg.num_key_value_heads, tp.rank,
                                 tp.world_size)
        self.head_dim = cfg.head_dim

    def split(self, full: int, what: str) -> tuple[int, int]:
        """(start, size) of this rank's even share of `full` rows; ValueError if uneven."""
        world = self.tp.world_size
        if full % world:
            raise ValueError(f"tensor_parallel_size {world} must divide {what} {full}")
        return self.tp.rank * (full // world), full // world

    def column(self, prefix: str, linear: nn.Linear, start: int, size: int) -> None:
        """Keep output rows [start, start + size) of a linear (and its bias)."""
        _resize(linear, "weight", (size, linear.in_features))
        self.plan[f"{prefix}.weight"] = Shard(0, start, size)
        if linear.bias is not None:
            _resize(linear, "bias", (size,))
            self.plan[f"{prefix}.bias"] = Shard(0, start, size)
        linear.out_features = size

    def fused_column(self, prefix: str, linear: nn.Linear,
                     parts: list[tuple[int, int, int]]) -> None:
        """Keep, of each part (offset, start, size) of a fused linear's output rows, rows
        [offset + start, offset + start + size), in part order (and the bias's)."""
        shard = FusedShard(tuple(Shard(0, offset + start, size) for offset, start, size in parts),
                           tuple(offset for offset, _, _ in parts))
        size = sum(part.size for part in shard.parts)
        _resize(linear, "weight", (size, linear.in_features))
        self.plan[f"{prefix}.weight"] = shard
        if linear.bias is not None:
            _resize(linear, "bias", (size,))
            self.plan[f"{prefix}.bias"] = shard
        linear.out_features = size

    def row(self, prefix: str, linear: nn.Linear, start: int, size: int) -> None:
        """Keep input columns [start, start + size); the output is all-reduced."""
        _resize(linear, "weight", (linear.out_features, size))
        self.plan[f"{prefix}.weight"] = Shard(1, start, size)
        linear.in_features = size
        linear.__class__ = RowParallelLinear
        linear.group_name = self.tp.group_name

    def query_heads(self) -> tuple[int, int]:
        """(first, count) of this rank's query heads."""
        return self.tp.rank * self.heads.num_heads, self.heads.num_heads

    def keep(self, prefix: str, module: nn.Module, name: str, shape: tuple[int, ...], *,
             dim: int, start: int, size: int) -> None:
        """Resize module's parameter `name` to `shape` (this rank's part); the loader reads
        rows [start, start + size) along `dim` of its checkpoint tensor (that tensor's own
        coordinates: a stacked, transposed one's differ from the parameter's)."""
        _resize(module, name, shape)
        self.plan[f"{prefix}.{name}"] = Shard(dim, start, size)

    def keep_parts(self, prefix: str, module: nn.Module, name: str, shape: tuple[int, ...], *,
                   dim: int, parts: list[tuple[int, int]]) -> None:
        """keep() of several (start, size) runs along `dim` of the checkpoint tensor, read in
        order and concatenated there (a stacked gate_up_proj's gate and up columns)."""
        _resize(module, name, shape)
        self.plan[f"{prefix}.{name}"] = FusedShard(tuple(Shard(dim, start, size)
                                                         for start, size in parts))

    def whole_experts(self, prefix: str, experts: nn.Module) -> None:
        """Expert parallelism over stacked checkpoint tensors ([E, ...] each): keep experts
        [first, first + count) whole (every parameter resized, routing ids mapped to them)."""
        first = self.tp.rank * (experts.num_experts // self.tp.world_size)
        shard_experts(experts, self.tp.rank, self.tp.world_size)
        for name, param in list(experts.named_parameters()):
            self.keep(prefix, experts, name, (experts.num_experts, *param.shape[1:]), dim=0,
                      start=first, size=experts.num_experts)

    def add_once(self, prefix: str, name: str) -> None:
        """A bias added to each rank's partial sums before their all-reduce: whole on rank 0,
        zeros on the others, so the sum holds it once."""
        if self.tp.rank:
            self.plan[f"{prefix}.{name}"] = ZeroShard()

    def reduce(self, block: nn.Module) -> None:
        """All-reduce the block's output (the sum of parts that each hold a slice)."""
        block.__class__ = reduced_class(type(block))
        block.group_name = self.tp.group_name

    def attention(self, prefix: str, attn: nn.Module, out: str = "o_proj") -> None:
        """Per-rank query heads and KV heads on q/k/v (by rows; a fused qkv_proj's q, k and v
        rows each) and the output projection `out` (by columns); q/k norms over the whole
        projections and a per-head `sinks` parameter too."""
        heads, dim = self.heads, self.head_dim
        q_start, q_size = self.tp.rank * heads.num_heads * dim, heads.num_heads * dim
        kv_start, kv_size = heads.first_kv_head * dim, heads.num_kv_heads * dim
        q_full = attn.num_heads * dim
        kv_full = getattr(attn, "num_kv_heads", attn.num_heads) * dim  # none: multi-head
        if hasattr(attn, "qkv_proj"):  # one linear: all q rows, then k's, then v's
            self.fused_column(f"{prefix}.qkv_proj", attn.qkv_proj, [
                (0, q_start, q_size), (q_full, kv_start, kv_size),
                (q_full + kv_full, kv_start, kv_size)])
        else:
            self.column(f"{prefix}.q_proj", attn.q_proj, q_start, q_size)
            for name in ("k_proj", "v_proj"):
                self.column(f"{prefix}.{name}", getattr(attn, name), kv_start, kv_size)
        self.row(f"{prefix}.{out}", getattr(attn, out), q_start, q_size)
        self.spanning_norm(f"{prefix}.q_norm", getattr(attn, "q_norm", None), q_full, q_start,
                           q_size)
        self.spanning_norm(f"{prefix}.k_norm", getattr(attn, "k_norm", None), kv_full, kv_start,
                           kv_size)
        if isinstance(getattr(attn, "sinks", None), nn.Parameter):  # a logit per query head
            first, count = self.query_heads()
            self.keep(prefix, attn, "sinks", (count,), dim=0, start=first, size=count)
        attn.num_heads, attn.num_kv_heads = heads.num_heads, heads.num_kv_heads

    def spanning_norm(self, prefix: str, norm: nn.Module | None, full: int, start: int,
                      size: int) -> None:
        """A norm over a whole projection (OLMo 2's q_norm / k_norm: `full` wide, every head)
        keeps its weight's [start, start + size) and reduces its mean square over the ranks;
        a per-head norm (head_dim wide, or a single KV head) is left whole, and one with a
        weight per head ([heads, head_dim]: Cohere's) keeps this rank's heads' rows."""
        if norm is not None and norm.weight.dim() == 2:
            heads = size // self.head_dim
            _resize(norm, "weight", (heads, self.head_dim))
            self.plan[f"{prefix}.weight"] = Shard(0, start // self.head_dim, heads)
            return
        if norm is None or full == self.head_dim or norm.weight.shape[0] != full:
            return
        if type(norm) is not Float32ScaleRMSNorm:
            raise ValueError(f"tensor_parallel_size {self.tp.world_size}: {prefix} "
                             f"({type(norm).__name__}) spans every head; only "
                             "Float32ScaleRMSNorm is sharded")
        _resize(norm, "weight", (size,))
        self.plan[f"{prefix}.weight"] = Shard(0, start, size)
        norm.__class__ = HeadsParallelRMSNorm
        norm.group_name, norm.world_size = self.tp.group_name, self.tp.world_size

    def mlp(self, prefix: str, mlp: nn.Module, reduce: bool = True) -> None:
        """gate/up by rows (a fused gate_up_proj's gate and up rows each), down by columns;
        `reduce` False inside a block reduced as a whole."""
        full = mlp.down_proj.in_features
        start, size = self.split(full, "intermediate_size")
        if hasattr(mlp, "gate_up_proj"):  # one linear: all gate rows, then up's
            self.fused_column(f"{prefix}.gate_up_proj", mlp.gate_up_proj,
                              [(0, start, size), (full, start, size)])
        else:
            self.column(f"{prefix}.gate_proj", mlp.gate_proj, start, size)
            self.column(f"{prefix}.up_proj", mlp.up_proj, start, size)
        self.row(f"{prefix}.down_proj", mlp.down_proj, start, size)
        if not reduce:
            mlp.down_proj.__class__ = nn.Linear  # partial sums: the block reduces them

    def ungated_mlp(self, prefix: str, mlp: nn.Module) -> None:
        """An ungated MLP (up, act, down under the checkpoint's names: up_proj / down_proj,
        c_fc / c_proj): up by rows, down by columns, its output all-reduced; the activation is
        elementwise, so each rank's slice of the intermediate is whole."""
        up, down = getattr(mlp, mlp.up_name), getattr(mlp, mlp.down_name)
        start, size = self.split(up.out_features, "intermediate_size")
        self.column(f"{prefix}.{mlp.up_name}", up, start, size)
        self.row(f"{prefix}.{mlp.down_name}", down, start, size)

    def moe(self, prefix: str, block: nn.Module) -> None:
        """Each expert's intermediate rows (w13 gate and up, w2 columns), the shared expert's
        too; the block's output (their sum) is all-reduced once. A model whose checkpoint
        stacks the experts as w13 / w2 (stacked_expert_tensors) has them read by slices."""
        experts, stacked = block.experts, getattr(self.model, "stacked_expert_tensors", False)
        if self.expert_parallel and stacked:
            self.whole_experts(f"{prefix}.experts", experts)
        elif self.expert_parallel:  # whole experts per rank: checkpoint tensors read whole
            shard_experts(experts, self.tp.rank, self.tp.world_size)
        else:
            self.expert_slices(prefix, experts, stacked)
        if block.shared_expert is not None:
            self.mlp(f"{prefix}.shared_expert", block.shared_expert, reduce=False)
        self.reduce(block)

    def expert_slices(self, prefix: str, experts: nn.Module, stacked: bool = False) -> None:
        """Every expert's intermediate rows [start, start + size) of w13 (gate and up) and
        columns of w2, from per-expert checkpoint tensors ([I, H] gate / up, [H, I] down) or
        stacked ones ([E, 2I, H] gate rows then up rows, [E, H, I])."""
        full, (num, _, hidden) = experts.intermediate_size, experts.w13_weight.shape
        start, size = self.split(full, "moe_intermediate_size")
        _resize(experts, "w13_weight", (num, 2 * size, hidden))
        _resize(experts, "w2_weight", (num, hidden, size))
        experts.intermediate_size = size
        self.plan[f"{prefix}.experts.w13_weight"] = FusedShard((
            Shard(1, start, size), Shard(1, full + start, size))) if stacked else Shard(
            0, start, size)
        self.plan[f"{prefix}.experts.w2_weight"] = Shard(1 + stacked, start, size)

    def vocab(self) -> None:
        """Embedding (at the model's embed_name, else model.embed_tokens) and LM head by vocab
        rows (a tied head shares the sharded table); a pipeline stage's missing ends skipped."""
        model, tp = self.model, self.tp
        owner, _, leaf = getattr(model, "embed_name", "model.embed_tokens").rpartition(".")
        embed, head = getattr(model.get_submodule(owner), leaf), model.lm_head
        if embed is None and head is None:
            return
        full = embed.num_embeddings if embed is not None else head.out_features
        size = -(-full // tp.world_size)  # the last ranks' rows past the vocabulary are zeros
        start = tp.rank * size
        shard = PaddedShard(0, start, size, max(0, min(size, full - start)))
        tied = embed is not None and head is not None and head.weight is embed.weight
        if embed is not None:
            _resize(embed, "weight", (size, embed.embedding_dim))
            self.plan[f"{owner}.{leaf}.weight"] = shard
            embed.num_embeddings = size
            embed.__class__ = vocab_parallel_class(type(embed))
            embed.group_name, embed.vocab_start = tp.group_name, start
        if head is None:
            return
        if tied:
            head.weight = embed.weight
        else:
            self.column("lm_head", head, start, size)
            self.plan.update({name: PaddedShard(0, start, size, shard.available)
                              for name in ("lm_head.weight", "lm_head.bias")
                              if name in self.plan})
        head.out_features = size
        head.__class__ = ParallelLMHead
        head.group_name, head.world_size, head.vocab_size = tp.group_name, tp.world_size, full


def check_shardable(config, world: int, expert_parallel: bool = False) -> None:
    """ValueError naming tensor_parallel_size if `world` ranks cannot split this decoder's
    heads or intermediate sizes evenly (checked before any rank starts; the vocabulary pads);
    with expert_parallel, naming enable_expert_parallel if they cannot split the experts."""
    if expert_parallel:
        check_expert_parallel(config, world)
    head_layout(config.num_attention_heads, config.num_key_value_heads, 0, world)
    sizes = {}  # (the vocabulary need not divide: its last rows are padded)
    moe = getattr(config, "moe", None)
    # the dense MLP's size only where a layer has one: Mixtral's intermediate_size is its
    # experts' (whole per rank under expert parallelism), an all-sparse Qwen-MoE never reads it
    if moe is None or not all(map(moe.is_sparse, range(config.num_hidden_layers))):
        sizes["intermediate_size"] = config.intermediate_size
    if moe is not None:
        if not expert_parallel:  # else each expert is whole on one rank
            sizes["moe_intermediate_size"] = moe.moe_intermediate_size
        sizes["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size or 0
    for name, size in sizes.items():
        if size % world:
            raise ValueError(f"tensor_parallel_size {world} must divide {name} {size}")


def shard_model(model: nn.Module, tp: TPGroup, expert_parallel: bool = False) -> dict[str, Shard]:
    """Shard a decoder built under parameters_on_meta for this rank (in place); returns the
    plan: parameter name -> the Shard of its checkpoint tensors. ValueError (naming
    tensor_parallel_size) for a size the ranks cannot split. expert_parallel: whole experts
    per rank (distributed/expert_parallel.py). A module with shard_for_tp(sharder, prefix)
    shards itself (and what it holds) through the _Sharder's primitives."""
    sharder, hooked = _Sharder(model, tp, expert_parallel), []
    for name, module in list(model.named_modules()):
        if any(name.startswith(f"{prefix}.") for prefix in hooked):
            continue  # inside a module that sharded itself
        leaf = name.rpartition(".")[2]
        if hasattr(module, "shard_for_tp"):
            module.shard_for_tp(sharder, name)
            hooked.append(name)
        elif hasattr(module, "o_proj") and (hasattr(module, "qkv_proj") or all(
                hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj"))):
            sharder.attention(name, module)
        elif hasattr(module, "experts") and hasattr(module, "shared_expert"):
            sharder.moe(name, module)
        elif leaf == "mlp" and hasattr(module, "up_name"):  # ungated (models/layers.DenseMLP)
            sharder.ungated_mlp(name, module)
        elif leaf in ("mlp", "feed_forward") and hasattr(module, "down_proj"):
            sharder.mlp(name, module)
    sharder.vocab()
    if expert_parallel:
        local_weight_names(model)
    heads = sharder.heads
    config = dataclasses.replace(model.config, num_attention_heads=heads.num_heads * tp.world_size,
                                 num_key_value_heads=heads.num_kv_heads)
    # per rank in the compile cache's key (the model's config is one of its factors)
    config.tensor_parallel = (f"rank {tp.rank} of {tp.world_size}"
                              + (", expert parallel" if expert_parallel else ""))
    model.config = config
    return sharder.plan


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give every meta parameter real (uninitialised) memory on device; tied ones stay tied."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in made:
                made[id(param)] = nn.Parameter(torch.empty(
                    param.shape, dtype=param_dtype(module, name, dtype), device=device),
                    requires_grad=False)
            module._parameters[name] = made[id(param)]


def build_sharded(model_cls: type[nn.Module], config, max_len: int, device: torch.device,
                  dtype: torch.dtype, tp: TPGroup,
                  expert_parallel: bool = False) -> tuple[nn.Module, dict[str, Shard]]:
    """This rank's shard of the model, parameters unloaded, and its load plan."""
    with torch.device(device), parameters_on_meta():
        model = model_cls(config, max_len=max_len)
    cast_model(model, dtype)
    plan = shard_model(model, tp, expert_parallel)
    materialize(model, device, dtype)
    return model, plan
