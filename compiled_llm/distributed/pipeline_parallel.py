"""Pipeline parallelism from outside the model: layers split into contiguous stages (vLLM's rule
or VLLM_PP_LAYER_PARTITION), each rank building and loading only its stage (embedding on the
first, final norm and LM head on the last); the step's send/recv between stages is
worker/pipeline_step.py's. Rank 0 (the engine's process) holds the last stage, so it samples
with the scheduler's requests at hand; ranks 1..N-1 hold stages 0..N-2."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.tensor_parallel import (
    materialize,
    parameters_on_meta,
    shard_model,
)
from compiled_llm.models.layers import cast_model
from compiled_llm.models.llama import LlamaModel

logger = logging.getLogger(__name__)
ENV_PARTITION = "VLLM_PP_LAYER_PARTITION"  # vLLM's spelling: layers per stage, "4,5,5,4"
_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def layer_partition(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage: VLLM_PP_LAYER_PARTITION's counts where it is set, else an even split
    whose remainder goes one layer each to the stages before the last (vLLM's rule: the last
    stage also holds the LM head). ValueError naming the field or the variable when a stage
    would hold no layer or the counts do not add up."""
    spelled = os.environ.get(ENV_PARTITION)
    if spelled:
        try:
            parts = [int(count) for count in spelled.split(",")]
        except ValueError:
            raise ValueError(f"{ENV_PARTITION} must be comma-separated layer counts, got "
                             f"{spelled!r}") from None
        if len(parts) != num_stages or sum(parts) != num_layers or min(parts) < 1:
            raise ValueError(f"{ENV_PARTITION}={spelled!r} must give each of the "
                             f"{num_stages} pipeline stages at least one layer, "
                             f"{num_layers} layers in all")
        return parts
    if num_layers < num_stages:
        raise ValueError(f"pipeline_parallel_size {num_stages} exceeds the model's "
                         f"{num_layers} layers: each stage needs at least one")
    parts = [num_layers // num_stages] * num_stages
    for index in range(2, num_layers % num_stages + 2):
        parts[-index] += 1
    return parts


def stage_rank(stage: int, num_stages: int) -> int:
    """The pipeline rank that holds `stage`: 0 (the engine's process) the last, s+1 stage s."""
    return (stage + 1) % num_stages


@dataclass(frozen=True)
class PipelineStage:
    """One rank's stage: layers [start_layer, end_layer) of the decoder, held by tp_size ranks
    (global rank = pipeline rank * tp_size + tp_rank); each talks to its own TP rank's peers."""

    stage: int
    num_stages: int
    start_layer: int
    end_layer: int
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def is_first(self) -> bool:
        """It embeds the input ids."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """It holds the final norm and the LM head (and so samples)."""
        return self.stage == self.num_stages - 1

    @property
    def prev_rank(self) -> int:
        """The rank it receives its input from (first stage: none, -1)."""
        return -1 if self.is_first else self._global(self.stage - 1)

    @property
    def next_rank(self) -> int:
        """The rank it sends its output to (last stage: none, -1)."""
        return -1 if self.is_last else self._global(self.stage + 1)

    def _global(self, stage: int) -> int:
        return stage_rank(stage, self.num_stages) * self.tp_size + self.tp_rank


def rank_stage(rank: int, num_stages: int, num_layers: int, tp_rank: int = 0,
               tp_size: int = 1) -> PipelineStage:
    """The stage pipeline rank `rank` holds, with its layer range (and its TP rank)."""
    stage = (rank - 1) % num_stages
    parts = layer_partition(num_layers, num_stages)
    start = sum(parts[:stage])
    return PipelineStage(stage, num_stages, start, start + parts[stage], tp_rank, tp_size)


def check_pipeline(model_cls: type[nn.Module], config, num_stages: int) -> None:
    """ValueError naming pipeline_parallel_size when the model cannot be split (checked before
    any rank starts): not a decoder with the Llama body's layer loop, or fewer layers than
    stages."""
    layer_partition(config.num_hidden_layers, num_stages)
    decoder = getattr(model_cls, "model_cls", None)
    # the stage's forward is the Llama body's loop, cut: a body with its own forward differs
    if not (isinstance(decoder, type) and issubclass(decoder, LlamaModel)
            and decoder.forward is LlamaModel.forward):
        raise ValueError(f"pipeline_parallel_size {num_stages}: {model_cls.__name__} is not a "
                         "decoder with a layer loop; use pipeline_parallel_size 1")


@functools.cache
def stage_class(cls: type[nn.Module]) -> type[nn.Module]:
    """cls (a decoder body: embed_tokens, layers, norm, rotary_emb) running one stage: its
    input is the ids on the first stage, else [T, 2, hidden] (hidden, residual) from the
    previous one; its output the final hidden on the last stage, else [T, 2, hidden]."""

    def forward(self, stage_input: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rope = self.rotary_emb(positions)
        if self.stage.is_first:
            hidden, residual = self.embed_tokens(stage_input), None
        else:
            hidden, residual = stage_input.unbind(1)
        for layer in self.layers.values():
            hidden, residual = layer(hidden, residual, rope)
        if self.stage.is_last:
            return self.norm(hidden, residual)[0]
        return torch.stack((hidden, residual), dim=1)

    return type(f"Stage{cls.__name__}", (cls,), {"forward": forward,
                                                 "__doc__": f"{cls.__name__}, one stage."})


def _prune(model: nn.Module, stage: PipelineStage) -> None:
    """Keep the stage's layers (under their checkpoint indices, attending to local KV caches)
    and its ends: the embedding on the first stage (and on the last when the LM head shares
    its table), the final norm and LM head on the last."""
    decoder, first, last = model.model, stage.is_first, stage.is_last
    layers = decoder.layers
    decoder.layers = nn.ModuleDict({str(index): layers[index]
                                    for index in range(stage.start_layer, stage.end_layer)})
    for local, layer in enumerate(decoder.layers.values()):
        layer.self_attn.layer_idx = local  # the runner's KV caches are this stage's only
    tied = model.lm_head.weight is decoder.embed_tokens.weight
    if not (first or (last and tied)):
        decoder.embed_tokens = None
    if not last:
        decoder.norm = model.lm_head = None
    decoder.__class__ = stage_class(type(decoder))
    decoder.stage = stage


def _stage_weight_name(base, others: set[str], hf_name: str):
    """base's target for a checkpoint tensor, or None (skip) when it fills another stage's
    parameter; names that fill none are left to the loader's error."""
    target = base(hf_name)
    ours = target if target is None or isinstance(target, str) else target.name
    return None if ours in others else target


def build_stage(model_cls: type[nn.Module], config, max_len: int, device: torch.device,
                dtype: torch.dtype, stage: PipelineStage, tp: TPGroup | None = None,
                expert_parallel: bool = False) -> tuple[nn.Module, dict | None]:
    """This rank's stage of the model, parameters unloaded (no memory is taken for the other
    stages' weights), and its load plan: with a tensor-parallel group of several ranks, its
    shard of the stage (tensor_parallel.shard_model), else None. Its config counts the
    stage's layers, so the runner sizes and allocates KV caches for them alone; the compile
    cache keys on the stage."""
    with torch.device(device), parameters_on_meta():
        model = model_cls(config, max_len=max_len)
    cast_model(model, dtype)
    full = {name for name, _ in model.named_parameters()}
    _prune(model, stage)
    own = {name for name, _ in model.named_parameters()}
    model.weight_name = functools.partial(_stage_weight_name, model.weight_name, full - own)
    config = dataclasses.replace(model.config,
                                 num_hidden_layers=stage.end_layer - stage.start_layer)
    config.pipeline_parallel = (f"stage {stage.stage} of {stage.num_stages}: layers "
                                f"[{stage.start_layer}, {stage.end_layer}), {_SOURCE}")
    model.config, model.pipeline_stage = config, stage
    plan = None
    if tp is not None and tp.world_size > 1:
        plan = shard_model(model, tp, expert_parallel)  # a new config: keep the stage's key
        model.config.pipeline_parallel = config.pipeline_parallel
    materialize(model, device, dtype)
    return model, plan


def localize_kv_scales(model: nn.Module) -> None:
    """The checkpoint's KV-cache scales of the stage's layers, by local layer index (the
    loader reads them by checkpoint index)."""
    stage, scales = model.pipeline_stage, model.checkpoint_kv_scales
    model.checkpoint_kv_scales = {layer - stage.start_layer: value
                                  for layer, value in scales.items()
                                  if stage.start_layer <= layer < stage.end_layer}
