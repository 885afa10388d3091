"""The multiprocess executor: a tensor-parallel engine whose worker is killed fails its
requests with an error naming the worker (no hang) and keeps refusing steps; settings it
cannot run (tensor or pipeline parallel) are refused up front, naming the field; a dropped
engine stops its worker."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.distributed.parallel_state import get_tp_group
from compiled_llm.entrypoints.cli.args import add_engine_args, engine_args
from tests.utils import make_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PARAMS = SamplingParams(temperature=0.0, max_tokens=4)
PROMPTS = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}]


@pytest.fixture(scope="module")
def llm():
    llm = LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
              max_model_len=128, engine_core_process=False, kv_cache_memory_bytes=4 << 20,
              tensor_parallel_size=2, distributed_executor_backend="mp")
    yield llm
    llm.shutdown()


def test_dropped_engine_stops_its_workers_and_leaves_the_group():
    """Runs before the module's engine: an LLM dropped without shutdown() ends its worker and
    leaves the process group, so another multi-rank engine can start in this process."""
    llm = LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
              max_model_len=128, engine_core_process=False, kv_cache_memory_bytes=4 << 20,
              tensor_parallel_size=2)
    assert len(llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 4
    (worker,) = llm.engine.executor.procs
    del llm  # no reference cycle holds the executor: it goes now
    worker.process.join(15)
    assert worker.process.exitcode == 0
    assert get_tp_group() is None


@pytest.mark.parametrize("field", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_a_shut_down_engine_dropped_late_leaves_the_next_engines_group(field):
    """Runs before the module's engine: shutdown() then a new engine, the old one collected
    only after; its second shutdown (from __del__) must not take the new engine's process
    group down."""
    kwargs = dict(dtype="float32", enforce_eager=True, max_model_len=128,
                  engine_core_process=False, kv_cache_memory_bytes=4 << 20, **{field: 2})
    first = LLM(str(make_checkpoint("llama")), **kwargs)
    first.shutdown()
    second = LLM(str(make_checkpoint("llama")), **kwargs)
    del first
    out = second.generate(PROMPTS[:1], PARAMS, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    second.shutdown()


def _assert_failed_by_dead_worker(outs) -> None:
    for out in outs:
        assert out.outputs[0].finish_reason == "error"
        assert "worker rank 1" in out.error and "died" in out.error


def test_worker_killed_mid_generation_fails_requests_with_a_clear_error(llm):
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    executor = llm.engine.executor
    (worker,) = executor.procs
    results = []
    long = SamplingParams(temperature=0.0, max_tokens=110, ignore_eos=True)
    thread = threading.Thread(target=lambda: results.extend(
        llm.generate(PROMPTS, long, use_tqdm=False)))
    thread.start()
    while llm.engine.num_used_blocks == 0 and thread.is_alive():
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)  # while the ranks run steps together
    thread.join(30)
    assert not thread.is_alive()  # failed, not hung
    _assert_failed_by_dead_worker(results)
    assert all(len(o.outputs[0].token_ids) < 110 for o in results)
    assert "died with exit code -9" in executor.dead
    assert llm.engine.num_used_blocks == 0
    # later steps are refused the same way, at once
    _assert_failed_by_dead_worker(llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("pipeline_parallel_size", 0, "pipeline_parallel_size"),
    ("distributed_executor_backend", "dask", "distributed_executor_backend"),
    ("tensor_parallel_size", 0, "tensor_parallel_size"),
])
def test_unsupported_parallel_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**{field: value})


def test_uni_backend_refuses_several_ranks():
    with pytest.raises(ValueError, match="tensor_parallel_size 2"):
        EngineArgs(tensor_parallel_size=2, distributed_executor_backend="uni")


@pytest.mark.parametrize(("field", "message"), [
    ("tensor_parallel_size", "tensor_parallel_size 3 must divide"),
    ("pipeline_parallel_size", "pipeline_parallel_size 3 exceeds the model's 2 layers"),
])
def test_unsplittable_models_are_refused_before_any_worker_starts(field, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
            engine_core_process=False, **{field: 3})


def test_architectures_not_sharded_yet_are_refused_by_name(monkeypatch):
    """A model class with supports_tensor_parallel = False is refused by name before any
    worker starts."""
    from compiled_llm.models.llama import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "supports_tensor_parallel", False, raising=False)
    with pytest.raises(ValueError, match="tensor_parallel_size 2: LlamaForCausalLM"):
        LLM(str(make_checkpoint("llama")), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=2)


def test_a_script_ending_with_its_engine_alive_exits_cleanly(tmp_path):
    """No shutdown() call, the interpreter exits: the workers stop at exit, with nothing on
    stderr about a failed __del__ (the modules it needs are still whole then)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        from compiled_llm import LLM, SamplingParams
        llm = LLM({str(make_checkpoint("llama"))!r}, dtype="float32", enforce_eager=True,
                  max_model_len=128, kv_cache_memory_bytes=4 << 20, tensor_parallel_size=2)
        out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        print("tokens", len(out[0].outputs[0].token_ids))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "tokens 3" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_cli_flags_spell_the_parallel_fields():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args(parser.parse_args(["-tp", "2", "-pp", "1",
                                          "--distributed-executor-backend", "mp"]))
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 1)
    assert args.executor_backend == "mp"
    long = engine_args(parser.parse_args(["--tensor-parallel-size", "2"]))
    assert long.executor_backend == "mp"  # the default for several ranks
    assert EngineArgs().executor_backend == "uni"
    stages = engine_args(parser.parse_args(["-pp", "2"]))
    assert (stages.pipeline_parallel_size, stages.world_size, stages.executor_backend) == (
        2, 2, "mp")
