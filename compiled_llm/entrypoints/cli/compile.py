"""`compiled-llm compile` (prebuild the compile cache, print what it cost) and
`compiled-llm cache` (list or clear it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from compiled_llm.entrypoints.cli.args import HelpFormatter, add_engine_args, engine_args

if TYPE_CHECKING:
    from compiled_llm.config import EngineArgs


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `compile` (the engine flags) and `cache ls|clear`."""
    parser = subparsers.add_parser("compile", formatter_class=HelpFormatter,
                                   help="prebuild the compile cache for a model")
    add_engine_args(parser)
    parser.add_argument("--output-json", default=None,
                        help="also write the start-up phases and compile counters here")
    parser.set_defaults(func=run_compile)
    cache = subparsers.add_parser("cache", formatter_class=HelpFormatter,
                                  help="list or clear the compile cache")
    cache.add_argument("action", choices=["ls", "clear"])
    cache.add_argument("--cache-dir", default=None,
                       help="compile cache directory (default: $COMPILED_LLM_CACHE_DIR or "
                            "~/.cache/compiled_llm)")
    cache.set_defaults(func=run_cache)


def run_compile(ns: argparse.Namespace) -> int:
    """Build an engine (which compiles, or loads from the cache), serve one one-token
    request, and report every start-up phase from process start to that first token. The
    engine runs without a tokenizer (--skip-tokenizer-init is implied)."""
    # the cache's contents do not depend on the tokenizer and the one request is token ids:
    # not loading it takes 1.2-1.7 s off an 8B cold compile
    args = dataclasses.replace(engine_args(ns), skip_tokenizer_init=True)
    with _worker_lines():
        _weights_beside_imports(args)
        from compiled_llm.compile import counters
        from compiled_llm.engine.llm_engine import LLMEngine

        counters.reset()
        engine = LLMEngine(args)
    phases = {**engine.startup_seconds, "first_request": _first_request(engine)}
    print(f"model: {args.model or 'embedded demo'}  device: {engine.device}  "
          f"dtype: {engine.dtype}")
    print(f"graphs captured {counters.graphs_captured}, pieces {counters.pieces}, "
          f"unique {counters.unique_pieces}, Inductor compiles {counters.inductor_compiles}, "
          f"cache hits {counters.cache_hits}, graph breaks {counters.graph_breaks}")
    for name, matches in sorted(counters.pass_matches.items()):
        print(f"  pass {name}: {matches} matches")
    print("start-up, in order (total: process start to ready):")
    for stage, secs in phases.items():
        print(f"  {stage:<34} {secs:8.2f} s")
    print("compile stages (within compile_and_profile):")
    for stage, secs in counters.stage_seconds.items():
        print(f"  {stage:<34} {secs:8.2f} s")
    if engine.cudagraph_batch_sizes:
        print(f"  CUDA graphs for batch sizes {engine.cudagraph_batch_sizes}")
    for kind, secs in engine.cudagraph_capture_seconds.items():
        print(f"  capture {kind:<26} {secs:8.2f} s")
    if ns.output_json:
        with open(ns.output_json, "w") as out:
            json.dump({"startup": phases, "stages": counters.stage_seconds,
                       "inductor_compiles": counters.inductor_compiles,
                       "cache_hits": counters.cache_hits}, out, indent=1)
    started = time.perf_counter()
    engine.shutdown()
    print(f"engine shut down in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    return 0


def _weights_beside_imports(args: EngineArgs) -> None:
    """As an engine core process does: the weights read (for the worker to take) while a
    thread imports the compiler and the engine, instead of after them."""
    from compiled_llm.engine.core_spec import load_weights_early
    from compiled_llm.worker import early_load

    early_load.import_loader()
    imports = early_load.BackgroundImports(*early_load.COMPILER_MODULES,
                                           "compiled_llm.engine.llm_engine")
    load_weights_early(args)
    imports.join()


def _first_request(engine) -> float:
    """Seconds to serve one request of one prompt token and one output token."""
    from compiled_llm import SamplingParams

    started = time.perf_counter()
    engine.add_request("compile-first-request", {"prompt_token_ids": [0]},
                       SamplingParams(max_tokens=1, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - started


@contextmanager
def _worker_lines() -> Iterator[None]:
    """The worker's and the backend's start-up lines (device context, weights phase, Triton
    compiles per phase, Inductor per piece) on stderr while the engine is built, beside the
    phase table this command prints."""
    logs = [logging.getLogger(name) for name in ("compiled_llm.worker", "compiled_llm.compile")]
    handler, levels = logging.StreamHandler(sys.stderr), [log.level for log in logs]
    for log in logs:
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.removeHandler(handler)
            log.setLevel(level)


def run_cache(ns: argparse.Namespace) -> int:
    """`cache clear` removes every entry; `cache ls` prints one line per entry."""
    from compiled_llm.compile import cache

    if ns.action == "clear":
        print(f"removed {cache.clear(ns.cache_dir)} cache entries")
        return 0
    for entry in cache.list_entries(ns.cache_dir):
        print(f"{entry['key']}  {entry['pieces']} pieces  {entry['bytes'] / 1e6:.1f} MB  "
              f"{entry['info']}")
    return 0
