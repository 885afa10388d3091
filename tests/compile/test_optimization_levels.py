"""Optimization levels and performance modes: the defaults each gives, explicit settings
winning one field at a time, the -O flags, and engines built at each level giving the same
greedy tokens."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.main import build_parser
from tests.utils import make_checkpoint

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5, 9, 2, 7, 11, 3]}, {"prompt_token_ids": [4, 1, 8]}]


def _compile(**kw):
    return EngineArgs(**kw).compile_config()


@pytest.mark.parametrize("level, mode, graphs, autotune", [
    (0, "none", "none", False), (1, "backend", "piecewise", False),
    (2, "backend", "full_and_piecewise", False), (3, "backend", "full_and_piecewise", True)])
def test_each_level_gives_its_defaults(level, mode, graphs, autotune):
    cfg = _compile(optimization_level=level)
    assert (cfg.mode, cfg.cudagraph_mode, cfg.max_autotune) == (mode, graphs, autotune)
    assert bool(cfg.inductor_options()) == autotune
    fusions_off = level == 0
    assert (cfg.passes.get("enable_horizontal_gemm") is False) == fusions_off


def test_explicit_settings_win_one_by_one():
    cfg = _compile(optimization_level=0, compile_mode="backend")
    assert (cfg.mode, cfg.cudagraph_mode) == ("backend", "none")  # graphs still from -O0
    cfg = _compile(optimization_level=3, max_autotune=False, cudagraph_mode="full")
    assert (cfg.max_autotune, cfg.cudagraph_mode) == (False, "full")
    cfg = _compile(optimization_level=0, passes={"enable_silu_mul": True})
    assert cfg.passes["enable_silu_mul"] and not cfg.passes["enable_rms_norm"]
    assert _compile(optimization_level=3, enforce_eager=True).mode == "none"


def test_performance_modes_set_batching_defaults():
    sched = EngineArgs(performance_mode="throughput").scheduler_config(4096)
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (512, 16384)
    sched = EngineArgs(performance_mode="interactivity", max_num_seqs=64).scheduler_config(4096)
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (64, 2048)
    sizes = _compile(performance_mode="interactivity", max_num_seqs=64).cudagraph_batch_sizes
    assert sizes == [*range(1, 33), 48, 64]
    assert _compile(performance_mode="interactivity", cudagraph_batch_sizes=[4]) \
        .cudagraph_batch_sizes == [4]
    balanced = EngineArgs().scheduler_config(4096)
    assert (balanced.max_num_seqs, balanced.max_num_batched_tokens) == (256, 8192)
    assert _compile().cudagraph_batch_sizes is None  # the runner's own default


@pytest.mark.parametrize("bad", [{"optimization_level": 4}, {"performance_mode": "fast"},
                                 {"max_num_seqs": 0}])
def test_bad_values_name_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        EngineArgs(**bad).scheduler_config(4096)


@pytest.mark.parametrize("argv, level", [(["-O0"], 0), (["-O3"], 3), (["-O", "1"], 1),
                                         (["--optimization-level", "2"], 2), ([], 2)])
def test_cli_spells_levels_as_vllm(argv, level):
    args = build_parser().parse_args(["serve", *argv])
    assert args.optimization_level == level


def test_cli_refuses_an_unknown_level(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "-O7"])
    assert "optimization-level" in capsys.readouterr().err


def _tokens(**kw) -> list[list[int]]:
    # in-process core: the compile counters are read in this process
    llm = LLM(str(make_checkpoint("qwen3")), dtype="float32", engine_core_process=False, **kw)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def test_levels_build_engines_with_the_same_tokens(monkeypatch):
    counters.reset()
    eager = _tokens(optimization_level=0)
    assert counters.inductor_compiles == 0  # -O0 compiles nothing
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")  # the passes must really run
    with torch._inductor.config.patch(fx_graph_cache=False):
        fast = _tokens(optimization_level=1)
    assert counters.inductor_compiles > 0 and counters.pass_matches["SiluMulFusionPass"] > 0
    assert fast == eager


def test_o3_autotunes_and_keeps_tokens(tmp_path):
    # Inductor's own cache keys on its config, max_autotune included: no stale hit
    tuned = _tokens(optimization_level=3, compile_cache_dir=str(tmp_path / "o3"))
    assert list((tmp_path / "o3").iterdir())  # its own cache entry (autotune is a factor)
    assert tuned == _tokens(optimization_level=0)


def test_max_cudagraph_capture_size_bounds_the_piecewise_graphs():
    assert EngineArgs().compile_config().piecewise_max_tokens == 512
    assert EngineArgs(max_cudagraph_capture_size=2048).compile_config().piecewise_max_tokens \
        == 2048
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineArgs(max_cudagraph_capture_size=0)


def test_piecewise_graphs_stop_at_the_token_budget():
    args = EngineArgs(max_cudagraph_capture_size=4096, max_num_batched_tokens=2048)
    assert args.compile_config().piecewise_max_tokens == 2048  # no step holds more
    assert EngineArgs(max_cudagraph_capture_size=4096).compile_config().piecewise_max_tokens \
        == 4096  # under the default 8192-token budget
