"""The safetensors reader of worker/weight_reader.py gives exactly the tensors safetensors gives:
every dtype, tensors cut across staging buffers, empty and 0-d tensors, metadata, several files;
iter_tensors takes it for whole reads on CUDA only; on a GPU it matches safe_open there."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from compiled_llm.worker import loader, weight_reader
from compiled_llm.worker.weight_reader import iter_safetensors, plan_fills, read_header

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn,
          torch.float8_e5m2]


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values of any dtype (float8 and bool through float32 and comparison)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 4).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def all_dtypes_tensors() -> dict[str, torch.Tensor]:
    """Per dtype: a multi-chunk tensor, a small one, a 0-d one and an empty one."""
    tensors = {}
    for number, dtype in enumerate(DTYPES):
        name = str(dtype).removeprefix("torch.")
        tensors[f"{name}.big"] = random_tensor((37, 29), dtype, number)
        tensors[f"{name}.small"] = random_tensor((3,), dtype, 100 + number)
        tensors[f"{name}.scalar"] = random_tensor((), dtype, 200 + number)
        tensors[f"{name}.empty"] = torch.empty((0, 5), dtype=dtype)
    return tensors


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (float8 and bool have no CPU equality of their own)."""
    return (got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)))


def read_all(paths: list[Path], device: str = "cpu", **kwargs) -> list[tuple[str, torch.Tensor,
                                                                            Path]]:
    """Every (name, tensor, path) the reader yields, in order."""
    return list(iter_safetensors(paths, device, **kwargs))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """One file of every dtype and shape kind, with __metadata__."""
    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    save_file(all_dtypes_tensors(), path, metadata={"format": "pt", "note": "test"})
    return path


@pytest.mark.parametrize("buffer_bytes", [1, 7, 64, 1000, 1 << 20])
@pytest.mark.parametrize("num_buffers", [1, 2, 4])
def test_matches_load_file(checkpoint, buffer_bytes, num_buffers):
    want = load_file(checkpoint)
    got = read_all([checkpoint], buffer_bytes=buffer_bytes, num_buffers=num_buffers,
                   num_threads=2)
    assert sorted(name for name, _, _ in got) == sorted(want)
    for name, tensor, path in got:
        assert path == checkpoint and same_bytes(tensor, want[name]), name


def test_file_order_and_metadata(checkpoint):
    entries, metadata = read_header(checkpoint)
    assert metadata == {"format": "pt", "note": "test"}
    starts = [entry.start for entry in entries]
    assert starts == sorted(starts)
    assert [name for name, _, _ in read_all([checkpoint])] == [entry.name for entry in entries]


def test_split_host_copies(checkpoint, monkeypatch):
    # several copy tasks per buffer, from several threads, into reused buffers
    monkeypatch.setattr(weight_reader, "MIN_SPLIT_BYTES", 5)
    want = load_file(checkpoint)
    for name, tensor, _ in read_all([checkpoint], buffer_bytes=300, num_buffers=2,
                                    num_threads=3):
        assert same_bytes(tensor, want[name]), name


def test_plan_fills_cover_every_byte_once(checkpoint):
    entries, _ = read_header(checkpoint)
    for buffer_bytes in (1, 7, 100, 4096):
        fills = plan_fills(entries, buffer_bytes)
        covered = {entry.name: [] for entry in entries}
        for fill in fills:
            assert 0 <= fill.stop - fill.start <= buffer_bytes
            for index, buffer_offset, tensor_offset, length in fill.pieces:
                assert length > 0 and buffer_offset + length <= fill.stop - fill.start
                assert fill.start + buffer_offset == entries[index].start + tensor_offset
                covered[entries[index].name].append((tensor_offset, length))
        for entry in entries:
            offsets = covered[entry.name]
            assert sum(length for _, length in offsets) == entry.end - entry.start
            assert [offset for offset, _ in offsets] == sorted(offset for offset, _ in offsets)
        finished = [index for fill in fills for index in fill.finished]
        assert finished == list(range(len(entries)))


def test_big_tensor_spans_buffers_small_ones_share(checkpoint):
    entries, _ = read_header(checkpoint)
    fills = plan_fills(entries, 1000)
    big = next(index for index, entry in enumerate(entries) if entry.name == "float64.big")
    assert sum(piece[0] == big for fill in fills for piece in fill.pieces) > 1
    assert max(len(fill.finished) for fill in fills) >= 4  # several small tensors per buffer


def test_several_files_and_no_metadata(tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"x": torch.arange(10.0)}, first)
    save_file({"y": torch.ones(2, 3, dtype=torch.bfloat16), "z": torch.zeros(0)}, second)
    assert read_header(second)[1] == {}
    got = read_all([first, second], buffer_bytes=16)
    assert [(name, path.name) for name, _, path in got] == [("x", "a.safetensors")] + [
        (entry.name, "b.safetensors") for entry in read_header(second)[0]]
    tensors = {name: tensor for name, tensor, _ in got}
    assert torch.equal(tensors["x"], torch.arange(10.0)) and tensors["z"].shape == (0,)
    assert torch.equal(tensors["y"], torch.ones(2, 3, dtype=torch.bfloat16))


def test_stops_early_without_hanging(checkpoint):
    reader = iter_safetensors([checkpoint], "cpu", buffer_bytes=7, num_threads=2)
    next(reader)
    reader.close()


def write_raw(path: Path, header: dict, data: bytes) -> Path:
    """A safetensors file from a hand-written header (for the malformed cases)."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize("header, data, message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, "need 8"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "file's end"),
    ({"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unsupported"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "overlaps"),
])
def test_malformed_headers(tmp_path, header, data, message):
    path = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(ValueError, match=message):
        read_header(path)


def test_header_longer_than_file(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="header of 1000 bytes"):
        read_header(path)


class FakeSafeOpen:
    """Stands in for safetensors.safe_open: records the device it was asked for."""

    devices: list[str] = []

    def __init__(self, path: str, framework: str, device: str):
        self.devices.append(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):
        """One tensor name."""
        return ["w"]

    def get_tensor(self, name: str):
        """A stand-in tensor."""
        return torch.zeros(1)

    def get_slice(self, name: str):
        """A stand-in sliceable tensor."""
        return torch.zeros(4)


@pytest.mark.parametrize("switch, index_of, expect", [
    ("1", None, "pinned"), (None, None, "pinned"), ("0", None, "cuda"),
    ("1", lambda name: slice(0, 2), "cuda")])
def test_iter_tensors_routes_whole_cuda_reads(monkeypatch, switch, index_of, expect):
    import safetensors

    calls = []
    monkeypatch.setattr(safetensors, "safe_open", FakeSafeOpen)
    monkeypatch.setattr(FakeSafeOpen, "devices", calls)
    monkeypatch.setattr(weight_reader, "iter_safetensors",
                        lambda files, device: calls.append("pinned") or iter(()))
    monkeypatch.setattr(weight_reader, "dtypes_supported", lambda files: True)
    if switch is None:
        monkeypatch.delenv("COMPILED_LLM_PINNED_LOAD", raising=False)
    else:
        monkeypatch.setenv("COMPILED_LLM_PINNED_LOAD", switch)
    list(loader.iter_tensors([Path("m.safetensors")], torch.device("cuda"), index_of))
    assert calls == [expect]
    calls.clear()
    list(loader.iter_tensors([Path("m.safetensors")], torch.device("cpu"), index_of))
    assert calls == ["cpu"]  # CPU reads stay on safetensors' own mmap


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("buffer_bytes", [1000, 1 << 20])
def test_cuda_matches_safe_open(checkpoint, tmp_path, buffer_bytes):
    # a second file reuses the buffers the first one's last copies came from
    second = tmp_path / "second.safetensors"
    save_file({"w": random_tensor((300, 70), torch.bfloat16, 7)}, second)
    want = {}
    for path in (checkpoint, second):
        with safe_open(str(path), framework="pt", device="cuda:0") as reader:
            want.update({name: reader.get_tensor(name) for name in reader.keys()})  # noqa: SIM118
    # each tensor copied on the current stream and dropped at once, as load_weights does
    got = [(name, tensor.clone()) for name, tensor, _ in iter_safetensors(
        [checkpoint, second], "cuda:0", buffer_bytes=buffer_bytes, num_buffers=2)]
    assert sorted(name for name, _ in got) == sorted(want)
    for name, tensor in got:
        assert tensor.device == want[name].device
        assert same_bytes(tensor.cpu(), want[name].cpu()), name
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_load_model_same_weights_either_way(name, monkeypatch):
    from tests.utils import make_checkpoint

    ckpt = make_checkpoint(name, dtype="bfloat16")
    weights = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("COMPILED_LLM_PINNED_LOAD", switch)
        model = loader.load_model(ckpt, torch.bfloat16, torch.device("cuda"), 128)
        weights[switch] = {key: value.cpu() for key, value in model.state_dict().items()}
    assert weights["0"].keys() == weights["1"].keys()
    for key, value in weights["0"].items():
        assert same_bytes(weights["1"][key], value), key


def test_a_dtype_the_reader_does_not_map_keeps_safetensors_reads(tmp_path, checkpoint):
    header = json.dumps({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    odd = tmp_path / "fp4.safetensors"
    odd.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00")
    assert weight_reader.dtypes_supported([checkpoint])
    assert not weight_reader.dtypes_supported([checkpoint, odd])
