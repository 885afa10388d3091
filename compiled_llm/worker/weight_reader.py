"""Reads safetensors files onto a device through a few reusable (pinned, on CUDA) host staging
buffers: the header is parsed here, the file mmapped, its bytes copied into a buffer by a thread
pool and from there to the device on a copy stream, while the next buffers fill."""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                "U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E8M0": "float8_e8m0fnu"}
DTYPES = {key: getattr(torch, name) for key, name in _DTYPE_NAMES.items() if hasattr(torch, name)}
BUFFER_BYTES = 64 << 20  # a few ms of host copy each: enough to hide the per-buffer sync
NUM_BUFFERS = 4
MIN_SPLIT_BYTES = 1 << 20  # a host copy task's least share of a buffer


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; start and end are absolute byte offsets in the file."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass
class Fill:
    """A buffer's worth of file bytes [start, stop): its pieces (entry index, buffer offset,
    tensor offset, length) and the entries whose last byte it holds (complete after it)."""

    start: int
    stop: int
    pieces: list[tuple[int, int, int, int]] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)


def dtypes_supported(paths: list[Path]) -> bool:
    """Whether every tensor of the files has a dtype this reader maps (else: safetensors')."""
    for path in paths:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(min(length, 100 << 20)))
        header.pop("__metadata__", None)
        if any(spec.get("dtype") not in DTYPES for spec in header.values()):
            return False
    return True


def read_header(path: str | os.PathLike) -> tuple[list[TensorEntry], dict[str, str]]:
    """The tensors of a safetensors file in file order, and its __metadata__ ({} if none)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > min(100 << 20, size - 8):  # 100 MiB: safetensors' own limit
            raise ValueError(f"{path}: header of {length} bytes in a file of {size}")
        header = json.loads(handle.read(length))
    metadata = header.pop("__metadata__", None) or {}
    entries = sorted((_entry(path, name, spec, 8 + length) for name, spec in header.items()),
                     key=lambda entry: (entry.start, entry.end))  # empty ones first
    for before, entry in zip([None, *entries], entries):
        if entry.end > size or (before is not None and entry.start < before.end):
            raise ValueError(f"{path}: tensor {entry.name!r} overlaps another or the file's end")
    return entries, metadata


def _entry(path, name: str, spec: dict, base: int) -> TensorEntry:
    """The TensorEntry of one header item, checked against its dtype and shape."""
    if spec["dtype"] not in DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {spec['dtype']}")
    dtype, shape = DTYPES[spec["dtype"]], tuple(int(dim) for dim in spec["shape"])
    begin, end = spec["data_offsets"]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if end - begin != expected or begin < 0:
        raise ValueError(f"{path}: tensor {name!r} spans {end - begin} bytes, "
                         f"its shape {shape} and dtype {spec['dtype']} need {expected}")
    return TensorEntry(name, dtype, shape, base + begin, base + end)


def plan_fills(entries: list[TensorEntry], buffer_bytes: int) -> list[Fill]:
    """Cut the tensors into buffer-sized fills: big tensors span several, small ones share."""
    fills: list[Fill] = []
    for index, entry in enumerate(entries):
        position = entry.start
        while True:
            if not fills or position >= fills[-1].start + buffer_bytes:
                fills.append(Fill(position, position))
            fill = fills[-1]
            fill.stop = min(entry.end, fill.start + buffer_bytes)  # never below its old stop
            if fill.stop > position:
                fill.pieces.append((index, position - fill.start, position - entry.start,
                                    fill.stop - position))
            position = fill.stop
            if position == entry.end:
                fill.finished.append(index)
                break
    return fills


class _Staging:
    """Staging buffers, copy threads and copy stream; on CPU the same steps run synchronously
    (and unpinned), so that the buffering and chunking are tested without a GPU."""

    def __init__(self, device: torch.device, buffer_bytes: int, num_buffers: int,
                 pool: ThreadPoolExecutor, split: int):
        self.device, self.buffer_bytes, self.pool, self.split = device, buffer_bytes, pool, split
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None  # None: no-op context
        self.buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=self.cuda)
                        for _ in range(num_buffers)]
        # per buffer, an event after its last copy out, kept across files (None: free)
        self.events: list[torch.cuda.Event | None] = [None] * num_buffers

    def submit(self, source: np.ndarray, fill: Fill, slot: int) -> list[Future]:
        """Start copying the fill into buffer `slot` once its last copy out has passed."""
        view = self.buffers[slot].numpy()
        return [self.pool.submit(_host_copy, source[begin:min(begin + self.split, fill.stop)],
                                 view[begin - fill.start:], self.events[slot])
                for begin in range(fill.start, fill.stop, self.split)]

    def copy(self, slot: int, target: torch.Tensor, piece: tuple[int, int, int, int]) -> None:
        """Copy one piece from buffer `slot` into the device bytes of its tensor."""
        _, buffer_offset, tensor_offset, length = piece
        source = self.buffers[slot][buffer_offset:buffer_offset + length]
        target[tensor_offset:tensor_offset + length].copy_(source, non_blocking=self.cuda)

    def device_bytes(self, raws: dict[str, torch.Tensor], entry: TensorEntry) -> torch.Tensor:
        """The entry's device bytes, allocated (on the copy stream) when first met."""
        if entry.name not in raws:
            raws[entry.name] = torch.empty(entry.end - entry.start, dtype=torch.uint8,
                                           device=self.device)
        return raws[entry.name]

    def publish(self, raw: torch.Tensor, entry: TensorEntry,
                event: torch.cuda.Event | None) -> torch.Tensor:
        """The finished tensor, made safe to use (and free) on the caller's current stream."""
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            raw.record_stream(current)  # allocated on the copy stream, used on this one
        return raw.view(entry.dtype).view(entry.shape)


def _host_copy(source: np.ndarray, target: np.ndarray, event: torch.cuda.Event | None) -> None:
    """Copy source to target's start once event has passed (numpy's copy drops the GIL)."""
    if event is not None:
        event.synchronize()
    np.copyto(target[:len(source)], source)


def _stream_file(path: Path, entries: list[TensorEntry], source: np.ndarray,
                 staging: _Staging) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """Yield (name, tensor, path) over one mmapped file, keeping every buffer in flight."""
    fills, slots = plan_fills(entries, staging.buffer_bytes), len(staging.buffers)
    pending = deque(staging.submit(source, fill, slot) for slot, fill in enumerate(fills[:slots]))
    raws: dict[str, torch.Tensor] = {}  # name -> device bytes of the tensors being filled
    try:
        for number, fill in enumerate(fills):
            slot = number % slots
            for future in pending.popleft():
                future.result()
            with torch.cuda.stream(staging.stream):
                for piece in fill.pieces:
                    staging.copy(slot, staging.device_bytes(raws, entries[piece[0]]), piece)
                finished = [(entries[index], staging.device_bytes(raws, entries[index]))
                            for index in fill.finished]
                event = (staging.stream.record_event(torch.cuda.Event(blocking=True))
                         if staging.cuda else None)  # blocking: waiting threads sleep, not spin
                staging.events[slot] = event
            if number + slots < len(fills):  # the buffer is free once `event` has passed
                pending.append(staging.submit(source, fills[number + slots], slot))
            for entry, raw in finished:
                del raws[entry.name]
                yield entry.name, staging.publish(raw, entry, event), path
    finally:  # no thread may write the buffers once this returns: cancel each task or wait
        wait([future for part in pending for future in part if not future.cancel()])


def iter_safetensors(paths: list[Path], device: torch.device | str,
                     buffer_bytes: int = BUFFER_BYTES, num_buffers: int = NUM_BUFFERS,
                     num_threads: int | None = None) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """Yield (name, tensor on device, path) over every tensor of the files, in file order."""
    headers = [(Path(path), read_header(path)[0]) for path in paths]
    spans = [entries[-1].end - entries[0].start for _, entries in headers if entries]
    buffer_bytes = max(1, min(buffer_bytes, max(spans, default=1)))  # small models pin little
    threads = num_threads or min(8, os.cpu_count() or 1)
    split = max(MIN_SPLIT_BYTES, buffer_bytes // threads)  # a share of a buffer per thread
    with ThreadPoolExecutor(threads, thread_name_prefix="weight-reader") as pool:
        staging = _Staging(torch.device(device), buffer_bytes, num_buffers, pool, split)
        try:
            for path, entries in headers:
                with open(path, "rb") as handle:  # the mmap keeps its own descriptor
                    mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                # never closed: it unmaps once no view is left (a cancelled task may hold one)
                yield from _stream_file(path, entries, np.frombuffer(mapped, np.uint8), staging)
        finally:
            if staging.stream is not None:
                staging.stream.synchronize()  # no buffer is freed under a copy
                # the tensors read were allocated on the copy stream: their cached blocks
                # would serve only that stream, and the KV budget counts them as free
                torch.cuda.empty_cache()
