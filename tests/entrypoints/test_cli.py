"""The `compiled-llm` command line: one documented flag per EngineArgs field with the
dataclass's defaults, vLLM's spellings and the older aliases, bad values refused, the same
engine flags on every subcommand, and `bench latency|throughput` end to end on the demo."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from compiled_llm.config import (
    CacheConfig,
    CompileConfig,
    EngineArgs,
    SchedulerConfig,
    config_docs,
    field_choices,
)
from compiled_llm.entrypoints.cli.args import (
    add_dataclass_args,
    add_engine_args,
    dataclass_from,
    engine_args,
    flag_name,
)
from compiled_llm.entrypoints.cli.bench import LatencyArgs, ThroughputArgs
from compiled_llm.entrypoints.cli.bench_serve import ServeBenchArgs
from compiled_llm.entrypoints.cli.main import build_parser, main
from compiled_llm.entrypoints.cli.serve import ServeArgs
from compiled_llm.entrypoints.server.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--enforce-eager", "--kv-cache-memory-bytes", str(16 << 20)]


def _parse(argv: list[str]) -> EngineArgs:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_args(parser.parse_args(argv))


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("cls", [EngineArgs, CacheConfig, SchedulerConfig, CompileConfig,
                                 ServerConfig, ServeArgs, LatencyArgs, ThroughputArgs,
                                 ServeBenchArgs])
def test_every_config_field_is_documented(cls):
    docs = config_docs(cls)
    assert [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)] == []


def test_every_engine_field_has_a_flag_with_help():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    actions = {a.dest: a for a in parser._actions}
    for field in dataclasses.fields(EngineArgs):
        action = actions[field.name]
        assert flag_name(field.name) in action.option_strings
        assert action.help and action.help.startswith(config_docs(EngineArgs)[field.name])


def test_no_flags_give_the_dataclass_defaults(monkeypatch):
    assert _parse([]) == EngineArgs()
    # a default_factory field keeps reading its env var
    monkeypatch.setenv("COMPILED_LLM_KV_CACHE_MEMORY_BYTES", "12345")
    assert _parse([]).kv_cache_memory_bytes == 12345 == EngineArgs().kv_cache_memory_bytes


def test_vllm_spellings():
    args = _parse(["--model", "m", "--tokenizer", "t", "--max-model-len", "512",
                   "--max-num-seqs", "4", "--max-num-batched-tokens", "1024",
                   "--block-size", "32", "--gpu-memory-utilization", "0.5",
                   "--no-enable-prefix-caching", "--async-scheduling", "--enforce-eager",
                   "--kv-cache-memory-bytes", "1000", "--num-gpu-blocks-override", "8",
                   "--scheduling-policy", "priority", "--load-format", "pt",
                   "--skip-tokenizer-init", "--no-enable-chunked-prefill",
                   "--passes", '{"enable_silu_mul": false}', "--quantization", "fp8"])
    assert args == EngineArgs(
        model="m", tokenizer="t", max_model_len=512, max_num_seqs=4,
        max_num_batched_tokens=1024, block_size=32, gpu_memory_utilization=0.5,
        enable_prefix_caching=False, async_scheduling=True, enforce_eager=True,
        kv_cache_memory_bytes=1000, num_gpu_blocks_override=8, scheduling_policy="priority",
        load_format="pt", skip_tokenizer_init=True, enable_chunked_prefill=False,
        passes={"enable_silu_mul": False}, quantization="fp8")


def test_bool_flags_negate():
    assert not _parse(["--no-enable-prefix-caching"]).enable_prefix_caching
    assert _parse(["--enable-prefix-caching"]).enable_prefix_caching
    assert not _parse(["--async-scheduling", "--no-async-scheduling"]).async_scheduling


def test_cli_flag():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_args(parser.parse_args([])).async_scheduling  # on by default
    assert not engine_args(parser.parse_args(["--no-async-scheduling"])).async_scheduling


@pytest.mark.parametrize("flag", ["--batch-sizes", "--cuda-graph-sizes",
                                  "--cudagraph-batch-sizes"])
def test_batch_size_list_and_its_aliases(flag):
    assert _parse([flag, "1", "2", "4"]).cudagraph_batch_sizes == [1, 2, 4]


def test_one_cuda_graph_size_is_the_largest_as_in_vllm():
    # vLLM 0.11: --cuda-graph-sizes N captures every size up to N, not N alone
    args = _parse(["--cuda-graph-sizes", "256"])
    assert (args.max_cudagraph_capture_size, args.cudagraph_batch_sizes) == (256, None)
    assert _parse(["--cuda-graph-sizes", "1", "8"]).max_cudagraph_capture_size == 8
    with pytest.raises(ValueError, match="cuda_graph_sizes sets max_cudagraph_capture_size"):
        _parse(["--cuda-graph-sizes", "256", "--max-cudagraph-capture-size", "128"])


def test_older_spellings_still_work():
    args = _parse(["--cache-dir", "/c", "--dump-dir", "/d", "--compile-mode", "stock"])
    assert (args.compile_cache_dir, args.dump_dir, args.compile_mode) == ("/c", "/d", "stock")
    assert _parse(["--compile-cache-dir", "/c"]).compile_cache_dir == "/c"


@pytest.mark.parametrize("argv", [["--scheduling-policy", "lifo"], ["--compile-mode", "jit"],
                                  ["--prefix-caching-hash-algo", "md5"],
                                  ["--attention-backend", "flash"], ["--quantization", "int4"],
                                  ["--load-format", "gguf"], ["--cudagraph-mode", "some"]])
def test_a_bad_choice_is_refused(argv, capsys):
    assert argv[0] in _refused(argv, capsys)


@pytest.mark.parametrize("value", ["[1, 2]", "{not json", "3"])
def test_passes_must_be_a_json_object(value, capsys):
    assert "--passes" in _refused(["--passes", value], capsys)


def test_a_bad_value_past_the_parser_names_the_field():
    with pytest.raises(ValueError, match="block_size"):
        _parse(["--block-size", "3"]).cache_config()
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        EngineArgs(prefix_caching_hash_algo="md5")


def test_choices_have_one_source():
    from compiled_llm.core.prefix_hash import HASH_ALGOS

    assert field_choices(EngineArgs)["prefix_caching_hash_algo"] is HASH_ALGOS
    assert field_choices(EngineArgs)["quantization"] == ("fp8", "gptq", "awq", "compressed-tensors",
                                                       "gptq_marlin", "awq_marlin", None)
    assert field_choices(EngineArgs)["attention_backend"] == ("auto", "torch", "triton")


def test_a_new_engine_field_gets_its_flag():
    @dataclasses.dataclass
    class WithNewField(EngineArgs):
        new_knob: int | None = None
        """A knob added later."""

    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, WithNewField)
    ns = parser.parse_args(["--new-knob", "3", "--max-num-seqs", "2"])
    built = dataclass_from(WithNewField, ns)
    assert (built.new_knob, built.max_num_seqs) == (3, 2)
    assert {a.dest: a.help for a in parser._actions}["new_knob"] == "A knob added later."


ENGINE_FLAGS = ["--max-num-seqs", "3", "--no-enable-prefix-caching", "--block-size", "32",
                "--batch-sizes", "1", "2", "--passes", '{"enable_silu_mul": false}']


@pytest.mark.parametrize("command", [["generate", "hello"], ["compile"], ["serve"],
                                     ["bench", "latency"], ["bench", "throughput"]])
def test_every_subcommand_takes_the_engine_flags(command):
    ns = build_parser().parse_args([*command, *ENGINE_FLAGS])
    assert engine_args(ns) == _parse(ENGINE_FLAGS)
    assert engine_args(ns).max_num_seqs == 3


def test_serve_options():
    ns = build_parser().parse_args(["serve", "--model", "m", "--port", "9001",
                                    "--api-key", "k", "--max-body-bytes", "100"])
    assert dataclass_from(ServeArgs, ns) == ServeArgs(port=9001)
    assert dataclass_from(ServerConfig, ns, model_name="m") == ServerConfig("m", ["k"], 100)
    with pytest.raises(ValueError, match="port"):
        ServeArgs(port=70000)


def test_serve_takes_several_api_keys_and_vllm_api_key(monkeypatch):
    """--api-key takes several keys (any passes); without it serve reads VLLM_API_KEY."""
    from compiled_llm.entrypoints.cli.serve import server_config

    def cfg(*flags):
        ns = build_parser().parse_args(["serve", "--model", "m", *flags])
        return server_config(ns, engine_args(ns), dataclass_from(ServeArgs, ns))

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert cfg().api_key is None
    assert cfg("--api-key", "k1", "k2").api_key == ["k1", "k2"]
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert cfg().api_key == ["from-env"]
    assert cfg("--api-key", "k1").api_key == ["k1"]  # the flag wins, as in vLLM
    with pytest.raises(ValueError, match="api_key"):
        ServerConfig("m", [""])


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_flag(flag, capsys):
    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == importlib.metadata.version("compiled-llm")


def test_config_file_flags_come_first_and_the_command_line_wins(tmp_path):
    """--config FILE (vLLM's): a YAML mapping of flags, read as if placed before the command
    line's own flags."""
    from compiled_llm.entrypoints.cli.config_file import expand_config

    path = tmp_path / "serve.yaml"
    path.write_text("port: 9001\nmax_num_seqs: 3\nenable-prefix-caching: false\n"
                    "served-model-name: [a, b]\nmiddleware: [mod.first, mod.second]\n"
                    "speculative-config: {method: ngram, num_speculative_tokens: 2}\n")
    argv = ["serve", "--model", "m", "--config", str(path), "--max-num-seqs", "5"]
    ns = build_parser().parse_args(expand_config(argv, str(path)))
    args = engine_args(ns)
    assert (ns.port, args.max_num_seqs, args.enable_prefix_caching) == (9001, 5, False)
    assert ns.served_model_name == ["a", "b"] and args.model == "m"
    assert ns.middleware == ["mod.first", "mod.second"]  # a repeated flag, once per value
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 2}


def test_config_file_may_give_a_required_flag(tmp_path):
    """run-batch's required -i / -o from the file alone (read before the command line is)."""
    from compiled_llm.entrypoints.cli.config_file import config_path, expand_config

    path = tmp_path / "batch.yaml"
    path.write_text("input-file: in.jsonl\noutput-file: out.jsonl\n")
    argv = ["run-batch", f"--config={path}"]
    assert config_path(argv) == str(path)
    ns = build_parser().parse_args(expand_config(argv, str(path)))
    assert (ns.input_file, ns.output_file) == ("in.jsonl", "out.jsonl")


@pytest.mark.parametrize("text,message", [(None, "cannot read"), ("- 1\n", "mapping"),
                                          ("no-such-flag: 1\n", "no-such-flag"),
                                          ("config: other.yaml\n", "another config")])
def test_config_file_refusals(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as done:
        main(["serve", "--config", str(path)])  # refused before any server starts
    assert done.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("keyword,shown,hidden", [
    ("max-num-seqs", "--max-num-seqs", "--port"),
    ("max_num_seqs", "--max-num-seqs", "--port"),
    ("listgroup", "request guards", "--max-num-seqs"),
    ("request guards", "--api-key", "--max-num-seqs"),
    ("all", "--max-num-seqs", "flags matching")])
def test_help_keyword(keyword, shown, hidden, capsys):
    """vLLM's --help=KEYWORD: the flags whose names hold it, listgroup, or one group."""
    with pytest.raises(SystemExit) as done:
        main(["serve", f"--help={keyword}"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and shown in out and hidden not in out


def test_help_keyword_matching_nothing(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help=no-such-thing"])
    assert done.value.code == 2 and "listgroup" in capsys.readouterr().err


def test_the_script_entry_point_is_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["compiled-llm"].split(":")
    assert getattr(importlib.import_module(module), func) is main


def test_bench_refuses_bad_sizes(capsys):
    assert main(["bench", "latency", "--num-iters", "0", *FAST]) == 2
    assert "num_iters" in capsys.readouterr().err
    assert main(["bench", "throughput", "--num-prompts", "0", *FAST]) == 2
    assert "num_prompts" in capsys.readouterr().err


def test_bench_throughput_end_to_end(tmp_path):
    """Through `python -m compiled_llm.entrypoints.cli`, on the demo model (no --model)."""
    out = tmp_path / "throughput.json"
    cmd = [sys.executable, "-m", "compiled_llm.entrypoints.cli", "bench", "throughput",
           "--num-prompts", "4", "--input-len", "8", "--output-len", "4", "--n", "2", *FAST,
           "--output-json", str(out)]
    res = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "requests/s" in res.stdout and "output tokens/s" in res.stdout
    result = json.loads(out.read_text())
    assert result["num_requests"] == 4
    assert result["total_output_tokens"] == 32 and result["total_num_tokens"] == 64  # n=2
    assert result["requests_per_second"] > 0 and result["tokens_per_second"] > 0


def test_bench_throughput_on_dataset_files(tmp_path):
    """sharegpt: each reply's token count generated for its prompt (--output-len overrides
    them, as vLLM's); custom: --custom-output-len tokens for each chat-templated prompt."""
    from transformers import AutoTokenizer

    from tests.utils import make_checkpoint

    model = make_checkpoint("llama")
    tok = AutoTokenizer.from_pretrained(model)
    texts = [("The quick brown fox jumps over the lazy dog.", "Permission is hereby granted."),
             ("Permission is hereby granted, free of charge,", "THE SOFTWARE IS PROVIDED AS IS")]
    sharegpt, custom = tmp_path / "sharegpt.json", tmp_path / "custom.jsonl"
    sharegpt.write_text(json.dumps([{"conversations": [{"from": "human", "value": q},
                                                       {"from": "gpt", "value": a}]}
                                    for q, a in texts]))
    custom.write_text("".join(json.dumps({"prompt": q}) + "\n" for q, _ in texts))

    def run(*argv: str) -> dict:
        out = tmp_path / "throughput.json"
        assert main(["bench", "throughput", "--model", str(model), *FAST, *argv,
                     "--output-json", str(out)]) == 0
        return json.loads(out.read_text())

    counts = [(len(tok(q).input_ids), len(tok(a).input_ids)) for q, a in texts]
    result = run("--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                 "--num-prompts", "5", "--no-oversample")
    assert (result["dataset_name"], result["num_requests"]) == ("sharegpt", 2)
    assert result["total_output_tokens"] == sum(n for _, n in counts)
    assert result["total_num_tokens"] == sum(p + n for p, n in counts)
    result = run("--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                 "--num-prompts", "3", "--output-len", "5")
    assert (result["num_requests"], result["total_output_tokens"]) == (3, 15)
    result = run("--dataset-name", "custom", "--dataset-path", str(custom),
                 "--num-prompts", "2", "--custom-output-len", "4")
    assert (result["num_requests"], result["total_output_tokens"]) == (2, 8)
    templated = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True) for q, _ in texts]
    assert result["total_num_tokens"] == 8 + sum(len(tok(t).input_ids) for t in templated)


def test_bench_latency_end_to_end(tmp_path, capsys):
    out = tmp_path / "latency.json"
    assert main(["bench", "latency", "--batch-size", "2", "--input-len", "8",
                 "--output-len", "4", "--num-iters", "3", "--num-iters-warmup", "1", *FAST,
                 "--output-json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Avg latency:" in printed and "90% percentile latency:" in printed
    result = json.loads(out.read_text())
    assert len(result["latencies"]) == 3
    assert min(result["latencies"]) <= result["percentiles"]["50"] <= max(result["latencies"])
    assert result["avg_latency"] > 0


def test_compile_reports_startup_and_cache_lists(tmp_path, capsys):
    assert main(["compile", *FAST, "--cache-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "model: embedded demo" in printed and "load" in printed
    assert main(["cache", "ls", "--cache-dir", str(tmp_path)]) == 0
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "removed" in capsys.readouterr().out


@pytest.mark.parametrize("early", ["1", "0"])
def test_compile_reads_the_weights_beside_its_imports(tmp_path, monkeypatch, capsys, early):
    monkeypatch.setenv("COMPILED_LLM_EARLY_LOAD", early)
    assert main(["compile", *FAST, "--cache-dir", str(tmp_path)]) == 0
    # the worker took the model loaded early (its phase is reported) unless that is off
    assert ("weights_early" in capsys.readouterr().out) == (early == "1")


def test_compile_builds_no_tokenizer(tmp_path, monkeypatch):
    def refuse(args):
        raise AssertionError("compile loaded the tokenizer")

    monkeypatch.setattr("compiled_llm.engine.llm_engine.load_tokenizer", refuse)
    assert main(["compile", *FAST, "--cache-dir", str(tmp_path)]) == 0


def test_api_server_count_defaults_to_one_off_cuda():
    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.cli.serve import auto_api_server_count

    assert auto_api_server_count(EngineArgs(device="cpu")) == 1
    assert auto_api_server_count(EngineArgs(engine_core_process=False)) == 1
    ns = build_parser().parse_args(["serve"])
    assert ns.api_server_count is None  # auto: chosen in run_serve


def test_serve_defaults_to_2048_token_steps_with_graphs_up_to_them():
    from compiled_llm.entrypoints.cli.serve import serving_defaults

    args = serving_defaults(EngineArgs())
    assert args.scheduler_config(4096, 4096).max_num_batched_tokens == 2048
    assert args.compile_config().piecewise_max_tokens == 2048
    assert EngineArgs().scheduler_config(4096, 4096).max_num_batched_tokens == 8192  # LLM's
    # a setting the user gives wins, and other modes keep their own defaults
    assert serving_defaults(EngineArgs(max_cudagraph_capture_size=256)) \
        .compile_config().piecewise_max_tokens == 256
    for kept in (EngineArgs(max_num_batched_tokens=8192), EngineArgs(performance_mode="throughput"),
                 EngineArgs(enable_chunked_prefill=False)):
        assert serving_defaults(kept) == kept


@pytest.mark.parametrize(("argv", "match"), [
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be in"),
    (["--block-size", "12"], "block_size must be a power of two")])
def test_cache_settings_are_refused_before_a_core_starts(argv, match):
    """Checked as the engine args are built (serve's front end), not in the core's start."""
    with pytest.raises(ValueError, match=match):
        _parse(argv)
