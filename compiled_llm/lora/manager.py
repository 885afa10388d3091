"""The device slot pool: max_loras slots per wrapped layer, adapters paged in from their PEFT
directories (a host LRU of max_cpu_loras loaded adapters) and out, least recently used first,
never one that a live request (scheduled, not yet finished or preempted) runs with. Each step
it fills the per-token slot buffer the wrapped layers read."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.lora.layers import LoRALinear, wrap_lora_modules
from compiled_llm.lora.peft import LoRAWeights, load_peft_adapter, lora_module_shapes
from compiled_llm.lora.request import LoRARequest


@dataclass(frozen=True)
class LoRASettings:
    """What the worker's LoRA pool is sized by."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int


def slot_rank(max_lora_rank: int) -> int:
    """Rank columns per slot: max_lora_rank up to a power of two, at least 16 (tl.dot's least
    width)."""
    return max(16, 1 << (max_lora_rank - 1).bit_length())


class LoRAManager:
    """Owns the wrapped layers' slot rows and the step buffer. Invariant: an adapter in a slot
    has its weights in every wrapped layer's rows of that slot, and an empty slot is zeros."""

    def __init__(self, model: nn.Module, settings: LoRASettings, max_tokens: int) -> None:
        if getattr(model.config, "moe", None) is not None:
            raise ValueError("enable_lora: mixture-of-experts models are not supported")
        if not getattr(model, "supports_lora", True):  # layers of several projection shapes
            raise ValueError(f"enable_lora: {type(model).__name__} takes no LoRA adapters")
        self.settings = settings
        self.shapes = lora_module_shapes(model.config)
        self.dtype = next(model.parameters()).dtype
        self.layers: dict[str, LoRALinear] = wrap_lora_modules(
            model, list(self.shapes), settings.max_loras, slot_rank(settings.max_lora_rank),
            max_tokens)
        self.meta = model.lora_meta
        self.slots: list[int | None] = [None] * settings.max_loras  # lora_int_id per slot
        self._lru: OrderedDict[int, int] = OrderedDict()  # resident id -> slot, oldest first
        self._host: OrderedDict[int, LoRAWeights] = OrderedDict()
        self.live: dict[str, int] = {}  # request id -> lora_int_id of its adapter
        self.loads = 0  # adapters paged into a slot so far
        device = self.meta.data.device
        cuda = device.type == "cuda"
        self._host_meta = (torch.empty_like(self.meta.data, device="cpu").pin_memory()
                           if cuda else self.meta.data)
        self._event = torch.cuda.Event() if cuda else None

    # ------------------------------------------------------------------ slots
    def resident(self) -> dict[int, int]:
        """lora_int_id -> slot of the adapters in device slots."""
        return dict(self._lru)

    def slot_of(self, lora: LoRARequest) -> int:
        """lora's slot, paging it in (evicting the least recently used adapter no live
        request runs with) when it is not resident."""
        lora_id = lora.lora_int_id
        if lora_id in self._lru:
            self._lru.move_to_end(lora_id)
            return self._lru[lora_id]
        slot = self._free_slot()
        weights = self._host_weights(lora)
        for name, layer in self.layers.items():
            layer.set_slot(slot, weights.modules.get(name))
        self.slots[slot] = lora_id
        self._lru[lora_id] = slot
        self.loads += 1
        return slot

    def _free_slot(self) -> int:
        if None in self.slots:
            return self.slots.index(None)
        busy = set(self.live.values())
        for lora_id, slot in self._lru.items():  # oldest first
            if lora_id not in busy:
                del self._lru[lora_id]
                self.slots[slot] = None
                return slot
        raise RuntimeError(f"all {len(self.slots)} LoRA slots (max_loras) hold adapters of "
                           "running requests")

    def _host_weights(self, lora: LoRARequest) -> LoRAWeights:
        weights = self._host.pop(lora.lora_int_id, None)
        if weights is None:
            weights = load_peft_adapter(lora.lora_path, self.shapes,
                                        self.settings.max_lora_rank, self.dtype)
        self._host[lora.lora_int_id] = weights
        while len(self._host) > self.settings.max_cpu_loras:
            self._host.popitem(last=False)
        return weights

    # ------------------------------------------------------------------ steps
    def release(self, request_ids) -> None:
        """Requests that finished or were preempted no longer hold their adapter's slot."""
        for request_id in request_ids:
            self.live.pop(request_id, None)

    def page_in(self, sched: SchedulerOutput) -> tuple[SchedulerOutput, dict[str, str]]:
        """Put the adapters of a step's requests in slots, before its inputs are built; the
        schedule without the requests whose adapter fails to load, and their errors."""
        for req, _ in sched.scheduled:  # live first: none of the step's adapters is evicted
            if req.lora_request is not None:
                self.live[req.request_id] = req.lora_request.lora_int_id
        failed: dict[int, str] = {}
        errors: dict[str, str] = {}
        for req, _ in sched.scheduled:
            lora = req.lora_request
            if lora is not None and lora.lora_int_id not in failed:
                try:
                    self.slot_of(lora)
                except ValueError as exc:  # its file changed since the front end read it
                    failed[lora.lora_int_id] = f"lora_request {lora.lora_name!r}: {exc}"
            if lora is not None and lora.lora_int_id in failed:
                errors[req.request_id] = failed[lora.lora_int_id]
        if not errors:
            return sched, errors
        left = [item for item in sched.scheduled if item[0].request_id not in errors]
        if not left:
            raise ValueError(f"no request of the step can run: {errors}")
        return SchedulerOutput(left, sched.finished_req_ids, sched.preempted_req_ids), errors

    def prepare_step(self, scheduled: list, padded_tokens: int) -> None:
        """Fill the step buffer for scheduled [(request, tokens)] (their adapters paged in)
        padded to padded_tokens rows: each token's slot, the tokens sorted by slot, the
        segment starts."""
        req_slots = np.array([-1 if req.lora_request is None else self.slot_of(req.lora_request)
                              for req, _ in scheduled], dtype=np.int64)
        counts = np.array([count for _, count in scheduled], dtype=np.int64)
        num_slots, size = len(self.slots), self.meta.max_tokens
        if padded_tokens > size:
            raise ValueError(f"a step of {padded_tokens} rows exceeds the LoRA step buffer "
                             f"({size})")
        token_slots = np.full(padded_tokens, -1, dtype=np.int64)  # padding: the base model
        token_slots[:int(counts.sum())] = np.repeat(req_slots, counts)
        if self._event is not None:
            self._event.synchronize()  # the previous step's copy has read the host buffer
        host = self._host_meta.numpy()
        host[:padded_tokens] = token_slots
        host[size:size + padded_tokens], host[2 * size:] = group_rows(token_slots, num_slots)
        self._send(padded_tokens, size)

    def _send(self, padded_tokens: int, size: int) -> None:
        if self._event is None:
            return
        data, host = self.meta.data, self._host_meta
        data[:padded_tokens].copy_(host[:padded_tokens], non_blocking=True)
        data[size:size + padded_tokens].copy_(host[size:size + padded_tokens], non_blocking=True)
        data[2 * size:].copy_(host[2 * size:], non_blocking=True)
        self._event.record()


def group_rows(token_slots: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(row indices grouped by slot, the base rows (-1) last; segment starts [S + 2]): the
    layout the kernels read (kernels/shrink_expand.py)."""
    segment = np.where(token_slots < 0, num_slots, token_slots)
    starts = np.zeros(num_slots + 2, dtype=np.int64)
    starts[1:] = np.cumsum(np.bincount(segment, minlength=num_slots + 1))
    return np.argsort(segment, kind="stable"), starts


def attach_lora(model: nn.Module, args, sched) -> LoRAManager:
    """Wrap model's projections for args' LoRA settings (EngineArgs) and key its compiled code
    by them. The step buffer holds the most tokens a step can pad to: the token budget, the
    sequence cap, or the largest CUDA graph (as the input batch sizes itself)."""
    compile_cfg = args.compile_config()
    max_tokens = max(sched.max_num_batched_tokens, sched.max_num_seqs,
                     compile_cfg.piecewise_max_tokens, *(compile_cfg.cudagraph_batch_sizes or [0]))
    settings = LoRASettings(args.max_loras, args.max_lora_rank,
                            max(args.max_cpu_loras or args.max_loras, 1))
    manager = LoRAManager(model, settings, max_tokens)
    model.extra_compile_factors = {"lora": (settings.max_loras, slot_rank(settings.max_lora_rank),
                                            _source_digest())}
    return manager


def _source_digest() -> str:
    """A hash of this package's sources: the compiled graph calls its op."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]
