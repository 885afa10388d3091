"""The compiled-llm backend: splitting, piece dedup, counters, cache hit/miss, corruption
recovery, dumps; outputs equal eager and stock torch.compile."""

from __future__ import annotations

import json

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from tests.utils import make_checkpoint, random_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def deep_ckpt():
    return make_checkpoint("qwen3_deep")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(5, 300, lo=2, hi=40, seed=5)]


@pytest.fixture(scope="module")
def eager_tokens(deep_ckpt, prompts):
    llm = LLM(str(deep_ckpt), enforce_eager=True, dtype="float32")
    return _tokens(llm, prompts)


def _tokens(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


def _backend_llm(ckpt, cache_dir, **kw):
    return LLM(str(ckpt), dtype="float32", compile_mode="backend",
               compile_cache_dir=str(cache_dir), **kw)


def test_split_dedup_and_cache_roundtrip(deep_ckpt, prompts, eager_tokens, tmp_path):
    counters.reset()
    llm = _backend_llm(deep_ckpt, tmp_path)
    layers = llm.engine.model_config.num_hidden_layers
    assert counters.graphs_captured == 1 and counters.recompiles == 0
    assert counters.pieces == layers + 1  # compute pieces between the attention ops
    assert counters.unique_pieces == 3  # first, the repeated layer, last
    assert counters.inductor_compiles == 3 and counters.cache_misses == 3
    assert _tokens(llm, prompts) == eager_tokens
    assert counters.graphs_captured == 1, "a batch size recompiled"

    counters.reset()
    warm = _backend_llm(deep_ckpt, tmp_path)
    assert counters.cache_hits == 3 and counters.inductor_compiles == 0
    assert counters.snapshot_loads == 1 and counters.graphs_captured == 0, "Dynamo ran"
    assert counters.pieces == layers + 1 and counters.unique_pieces == 3
    assert _tokens(warm, prompts) == eager_tokens
    assert warm.engine.num_used_blocks == 0


def test_corrupt_cache_entry_is_rebuilt(deep_ckpt, prompts, eager_tokens, tmp_path, caplog):
    _backend_llm(deep_ckpt, tmp_path)
    entries = sorted(tmp_path.rglob("*.bin"))
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # truncated
    data = bytearray(entries[1].read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    entries[1].write_bytes(bytes(data))
    counters.reset()
    llm = _backend_llm(deep_ckpt, tmp_path)
    assert counters.cache_corrupt == 2 and counters.inductor_compiles == 2
    assert "corrupt" in caplog.text
    assert _tokens(llm, prompts) == eager_tokens
    counters.reset()
    _backend_llm(deep_ckpt, tmp_path)
    assert counters.cache_hits == 3 and counters.cache_corrupt == 0


def test_corrupt_snapshot_falls_back_to_dynamo(deep_ckpt, prompts, eager_tokens, tmp_path,
                                              caplog):
    _backend_llm(deep_ckpt, tmp_path)
    (snap,) = tmp_path.rglob("graph-*.pkl")
    data = bytearray(snap.read_bytes())
    data[len(data) // 3] ^= 0xFF
    snap.write_bytes(bytes(data))
    counters.reset()
    llm = _backend_llm(deep_ckpt, tmp_path)
    assert counters.snapshot_loads == 0 and counters.graphs_captured == 1
    assert counters.cache_corrupt == 1 and counters.inductor_compiles == 0
    assert "corrupt" in caplog.text
    assert _tokens(llm, prompts) == eager_tokens
    counters.reset()
    _backend_llm(deep_ckpt, tmp_path)  # the fallback stored a fresh snapshot
    assert counters.snapshot_loads == 1 and counters.cache_corrupt == 0


def test_dump_dir_writes_each_unique_piece(deep_ckpt, tmp_path):
    dump = tmp_path / "dump"
    _backend_llm(deep_ckpt, tmp_path / "cache", dump_dir=str(dump))
    index = json.loads((dump / "pieces.json").read_text())
    assert len(index) == 3
    for entry in index:
        d = dump / entry["dir"]
        assert "def forward" in (d / "input_graph.py").read_text()
        code = list(d.glob("inductor_output_code_*.py"))
        assert code and "def call" in code[0].read_text()
        # the passes ran and wrote their dumps, even where Inductor's own cache had the
        # piece (an earlier test compiled the same graphs)
        assert (d / "00_before.py").exists() and (d / "99_after.py").exists()
        assert (d / "summary.md").exists()


def test_all_modes_agree(deep_ckpt, prompts, eager_tokens, tmp_path):
    stock = LLM(str(deep_ckpt), dtype="float32", compile_mode="stock")
    assert _tokens(stock, prompts) == eager_tokens
    none = LLM(str(deep_ckpt), dtype="float32", compile_mode="none")
    assert _tokens(none, prompts) == eager_tokens
