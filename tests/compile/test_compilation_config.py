"""vLLM's compilation_config (dict, JSON, int, object; -cc / -O spellings on the command line)
read into the engine's compile fields, unsupported keys refused by name, and an engine built
from it running as asked."""

from __future__ import annotations

import enum
import types

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.args import engine_args
from compiled_llm.entrypoints.cli.main import build_parser
from tests.utils import make_checkpoint


class CUDAGraphMode(enum.Enum):  # vLLM's enum, as an object's field holds it
    FULL_DECODE_ONLY = (2, 0)


@pytest.mark.parametrize("given", [
    {"mode": 3, "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [4, 1, 2],
     "pass_config": {"fuse_act_quant": False}, "debug_dump_path": "/d", "cache_dir": "/c"},
    '{"level": 3, "cudagraph_mode": "piecewise", "cudagraph_capture_sizes": [1, 2, 4], '
    '"pass_config": {"enable_fusion": false}, "debug_dump_path": "/d", "cache_dir": "/c"}'])
def test_compilation_config_sets_the_engine_fields(given):
    args = EngineArgs(compilation_config=given)
    assert (args.compile_mode, args.cudagraph_mode) == ("backend", "piecewise")
    assert (args.cudagraph_batch_sizes, args.max_cudagraph_capture_size) == ([1, 2, 4], 4)
    assert args.passes == {"enable_fp8_quant_fusion": False}
    assert (args.dump_dir, args.compile_cache_dir) == ("/d", "/c")
    cfg = args.compile_config()
    assert (cfg.mode, cfg.cudagraph_batch_sizes, cfg.piecewise_max_tokens) == ("backend",
                                                                               [1, 2, 4], 4)


def test_modes_by_number_name_and_object():
    assert EngineArgs(compilation_config=0).compile_config().mode == "none"
    assert EngineArgs(compilation_config={"mode": "STOCK_TORCH_COMPILE"}).compile_mode == "stock"
    obj = types.SimpleNamespace(mode=3, cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
                                pass_config=types.SimpleNamespace(eliminate_noops=False),
                                inductor_compile_config={"max_autotune": True}, level=None)
    args = EngineArgs(compilation_config=obj)
    assert (args.compile_mode, args.cudagraph_mode, args.max_autotune) == ("backend", "full", True)
    assert args.passes == {"enable_noop": False}


def test_vllm_compilation_config_class():
    from compiled_llm.config import CompilationConfig  # vLLM: from vllm.config import ...

    args = EngineArgs(compilation_config=CompilationConfig(
        mode=3, cudagraph_capture_sizes=[1, 2, 8], pass_config={"enable_noop": False}))
    assert (args.cudagraph_batch_sizes, args.max_cudagraph_capture_size) == ([1, 2, 8], 8)
    assert args.compile_mode == "backend" and args.passes == {"enable_noop": False}
    with pytest.raises(ValueError, match="compilation_config.splitting_ops"):
        EngineArgs(compilation_config=CompilationConfig(splitting_ops=["x"]))


@pytest.mark.parametrize("given, named", [
    ({"custom_ops": ["none"]}, "custom_ops"), ({"splitting_ops": []}, "splitting_ops"),
    ({"compile_sizes": [1, 2]}, "compile_sizes"), ({"use_inductor": False}, "use_inductor"),
    ({"pass_config": {"enable_sequence_parallelism": True}}, "enable_sequence_parallelism"),
    ({"pass_config": {"fuse_norm_qunat": True}}, "fuse_norm_qunat"),
    ({"inductor_compile_config": {"triton.cudagraphs": True}}, "inductor_compile_config"),
    ({"mode": 7}, "mode"), ({"cudagraph_mode": "SOME"}, "cudagraph_mode"),
    ({"full_cuda_graph": True}, "full_cuda_graph")])
def test_unsupported_keys_are_refused_by_name(given, named):
    with pytest.raises(ValueError, match=f"compilation_config.*{named}"):
        EngineArgs(compilation_config=given)


def test_no_op_values_and_conflicts():
    args = EngineArgs(compilation_config={"compile_cache_save_format": "unpacked",
                                          "use_inductor": True, "custom_ops": []})
    assert args.compile_mode is None and args.compilation_config is None
    with pytest.raises(ValueError, match="cudagraph_mode"):
        EngineArgs(cudagraph_mode="full", compilation_config={"cudagraph_mode": "NONE"})


@pytest.mark.parametrize("argv, mode, graphs, level", [
    (["-cc.mode=1", "-cc.cudagraph_mode=NONE"], "stock", "none", 2),
    (["-O", '{"mode": 0}'], "none", None, 2), (["-O.mode=3", "-O1"], "backend", None, 1),
    (["--compilation-config", "3"], "backend", None, 2), (["-O3"], None, None, 3)])
def test_cli_spellings(argv, mode, graphs, level):
    args = engine_args(build_parser().parse_args(["serve", *argv]))
    assert (args.compile_mode, args.cudagraph_mode, args.optimization_level) == (mode, graphs,
                                                                                 level)


def test_an_engine_runs_as_compilation_config_asks(tmp_path):
    ckpt = str(make_checkpoint("qwen3"))
    counters.reset()
    llm = LLM(ckpt, dtype="float32", engine_core_process=False,
              compilation_config={"mode": "NONE", "cache_dir": str(tmp_path)})
    out = llm.generate([{"prompt_token_ids": [5, 9, 2]}],
                       SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert counters.inductor_compiles == 0  # mode NONE: eager, as -O0
