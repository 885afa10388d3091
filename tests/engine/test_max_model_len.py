"""max_model_len: the model's length by default, capped by what the KV cache holds, an explicit
value it cannot hold refused; greedy outputs as at an explicit value; and a step's block-table
and input copies the same size whatever max_model_len is."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs, model_len_bounds
from compiled_llm.engine.llm_engine import DEMO_MODEL
from compiled_llm.entrypoints.cli.args import add_engine_args, engine_args
from compiled_llm.worker.step_buffers import table_width
from compiled_llm.worker.worker import settle_max_model_len
from tests.utils import random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
BLOCK_BYTES = 2 * 16 * 2 * 32 * 4 * 2  # K and V, 16 tokens, 2 KV heads of 32, 4 layers, bf16
DEMO_LEN = json.loads((DEMO_MODEL / "config.json").read_text())["max_position_embeddings"]


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _llm(**kw) -> LLM:
    return LLM(enforce_eager=True, **kw)


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(4, 2048, lo=5, hi=90)]


@pytest.fixture(scope="module")
def baseline(prompts):
    """Greedy tokens at the value EngineArgs gave before it fitted the KV cache."""
    llm = _llm(max_model_len=DEMO_LEN)
    assert llm.engine.max_model_len == DEMO_LEN
    out = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert llm.engine.num_used_blocks == 0
    return out


# ----------------------------------------------------------------------------- the model's length
@pytest.mark.parametrize("hf,bounds", [
    ({"max_position_embeddings": 1024}, (1024, 1024)),
    ({}, (2048, 2048)),
    ({"max_position_embeddings": 4096, "seq_length": 2048}, (2048, 2048)),  # the smallest
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}},
     (16384, 16384)),
    ({"max_position_embeddings": 512, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     (1024, 512)),  # dynamic NTK: only an explicit value goes past the trained length
    ({"max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}},
     (131072, 131072)),
    ({"max_position_embeddings": 32768, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     (131072, 131072)),
    ({"max_position_embeddings": 131072, "rope_scaling": {  # transformers: factor = the ratio
        "rope_type": "yarn", "factor": None, "original_max_position_embeddings": 32768}},
     (131072, 131072)),
])
def test_model_len_bounds_as_vllm_derives_them(hf, bounds):
    assert model_len_bounds(hf) == bounds


@pytest.mark.parametrize("value", [None, "auto", -1])
def test_auto_spellings(value):
    assert EngineArgs(max_model_len=value).max_model_len is None


@pytest.mark.parametrize("value", [0, -2, "long", 1.5])
def test_bad_max_model_len_is_refused(value):
    with pytest.raises(ValueError, match="max_model_len"):
        EngineArgs(max_model_len=value)


@pytest.mark.parametrize("flag,value", [("auto", None), ("-1", None), ("512", 512)])
def test_cli_flag(flag, value):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_args(parser.parse_args(["--max-model-len", flag])).max_model_len == value


def test_settle():
    assert settle_max_model_len(1024, False, 65, 16) == 1024  # 64 usable blocks hold 1024
    assert settle_max_model_len(1024, False, 20, 16) == 304
    with pytest.raises(ValueError, match=r"max_model_len 1024 .* holds 304 tokens"):
        settle_max_model_len(1024, True, 20, 16)


# ----------------------------------------------------------------------------- engines
def test_default_is_the_models_length(prompts, baseline):
    llm = _llm()
    assert llm.engine.max_model_len == DEMO_LEN == llm.engine.inputs.max_model_len
    assert llm.engine.scheduler.cfg.max_model_len == DEMO_LEN
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert llm.engine.num_used_blocks == 0


@pytest.mark.parametrize("kw", [{"num_gpu_blocks_override": 20},
                                {"kv_cache_memory_bytes": 20 * BLOCK_BYTES + 100}])
def test_default_capped_by_the_kv_cache(kw, prompts, baseline):
    llm = _llm(**kw)
    engine = llm.engine
    assert engine.executor.num_blocks == 20
    assert engine.max_model_len == 19 * 16 == engine.scheduler.cfg.max_model_len
    assert engine.executor.worker.runner.input_batch.max_blocks == 19  # remade at that width
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert engine.num_used_blocks == 0
    with pytest.raises(ValueError, match="max_model_len"):  # the settled value is the bound
        llm.generate({"prompt_token_ids": [1] * 304}, GREEDY, use_tqdm=False)
    assert engine.num_used_blocks == 0


def test_explicit_value_the_kv_cache_cannot_hold():
    with pytest.raises(ValueError, match=r"max_model_len 1024 .* holds 304 tokens"):
        _llm(max_model_len=1024, num_gpu_blocks_override=20)
    llm = _llm(max_model_len=304, num_gpu_blocks_override=20)  # exactly what it holds
    assert llm.engine.max_model_len == 304 and llm.engine.num_used_blocks == 0


def test_explicit_value_past_the_model():
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds"):
        _llm(max_model_len=4096)


# ----------------------------------------------------------------------------- per-step work
@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """The demo model claiming 131072 positions (weights and tokenizer as they are)."""
    out = tmp_path_factory.mktemp("long-demo")
    for path in DEMO_MODEL.iterdir():
        shutil.copy(path, out / path.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 131072}))
    return str(out)


def _step_copies(model: str, max_model_len: int | None, prompts):
    """(max_model_len, table width, tokens, [per step: int64 and int32 elements copied,
    block-table columns gathered])."""
    llm = _llm(model=model, max_model_len=max_model_len, kv_cache_memory_bytes=9000 * BLOCK_BYTES)
    batch = llm.engine.executor.worker.runner.input_batch
    copies, send = [], batch.send

    def spy(layout, views, width):
        send(layout, views, width)
        copies.append((layout.end64, layout.end32, batch.table_width))

    batch.send = spy
    out = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert llm.engine.num_used_blocks == 0
    return llm.engine.max_model_len, batch.max_blocks, out, copies


def test_step_copies_do_not_grow_with_max_model_len(long_model, prompts, baseline):
    short = _step_copies(long_model, 2048, prompts)
    long = _step_copies(long_model, None, prompts)
    assert (short[0], short[1]) == (2048, 128) and (long[0], long[1]) == (131072, 8192)
    assert short[2] == long[2] == baseline
    assert short[3] == long[3]  # the same elements copied and columns gathered, step by step
    longest = max(len(p["prompt_token_ids"]) for p in prompts) + GREEDY.max_tokens
    assert max(width for _, _, width in long[3]) == table_width(-(-longest // 16), 8192) < 16
