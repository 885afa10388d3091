"""The `compiled-llm` command line: `generate` and `serve`; each subcommand registers itself
here."""

from __future__ import annotations

import argparse
import sys

from compiled_llm.config import EngineArgs


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by every subcommand that builds an engine (EngineArgs fields)."""
    p.add_argument("--model", default=None, help="HF model dir (default: the embedded demo)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--compile-mode", default="backend", choices=["backend", "stock", "none"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None, help="compile cache dir")
    p.add_argument("--dump-dir", default=None, help="write pass/Inductor dumps per piece here")
    p.add_argument("--cudagraph-mode", default="full_and_piecewise",
                   choices=["none", "piecewise", "full", "full_and_piecewise"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help="CUDA graph batch sizes to capture")
    p.add_argument("--quantization", default=None, choices=["fp8"])
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--async-scheduling", action="store_true",
                   help="launch the next step before reading this one's tokens")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                   help="KV-cache budget in bytes (CPU; overrides the GPU fraction)")


def engine_args(ns: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=ns.model, dtype=ns.dtype, device=ns.device, max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        enforce_eager=ns.enforce_eager, compile_mode=ns.compile_mode, seed=ns.seed,
        compile_cache_dir=ns.cache_dir, dump_dir=ns.dump_dir, cudagraph_mode=ns.cudagraph_mode,
        cudagraph_batch_sizes=ns.batch_sizes, quantization=ns.quantization,
        attention_backend=ns.attention_backend, async_scheduling=ns.async_scheduling,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes)


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one or more prompts, streamed")
    add_engine_args(p)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sample-seed", type=int, default=None, help="per-request sampling seed")
    p.add_argument("--stop", action="append", default=None)
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.set_defaults(func=run_generate)


def run_generate(ns: argparse.Namespace) -> int:
    from compiled_llm.engine.llm_engine import LLMEngine
    from compiled_llm.output.detokenizer import held_back_chars
    from compiled_llm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature,
                            top_p=ns.top_p, top_k=ns.top_k, seed=ns.sample_seed, stop=ns.stop)
    engine = LLMEngine(engine_args(ns))
    for i, prompt in enumerate(ns.prompts):
        engine.add_request(str(i), prompt, params)
    # prompts print in order: the current one streams live, later ones wait their turn
    texts, done, shown, cur = [""] * len(ns.prompts), [False] * len(ns.prompts), 0, 0
    sys.stdout.write(ns.prompts[0])
    while cur < len(ns.prompts):
        for out in engine.step() if engine.has_unfinished_requests() else []:
            i = int(out.request_id)
            texts[i], done[i] = out.outputs[0].text, out.finished
        safe = len(texts[cur]) - (0 if done[cur] else held_back_chars(texts[cur], ns.stop or []))
        sys.stdout.write(texts[cur][shown:safe])
        sys.stdout.flush()
        shown = max(shown, safe)
        if done[cur]:
            cur, shown = cur + 1, 0
            sys.stdout.write("\n" + (ns.prompts[cur] if cur < len(ns.prompts) else ""))
    return 0


def _compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="prebuild the compile cache for a model")
    add_engine_args(p)
    p.set_defaults(func=run_compile)
    c = sub.add_parser("cache", help="list or clear the compile cache")
    c.add_argument("action", choices=["ls", "clear"])
    c.add_argument("--cache-dir", default=None)
    c.set_defaults(func=run_cache)


def run_compile(ns: argparse.Namespace) -> int:
    from compiled_llm.compile import counters
    from compiled_llm.engine.llm_engine import LLMEngine

    counters.reset()
    engine = LLMEngine(engine_args(ns))
    c = counters
    print(f"model: {ns.model or 'embedded demo'}  device: {engine.device}  dtype: {engine.dtype}")
    print(f"graphs captured {c.graphs_captured}, pieces {c.pieces}, unique {c.unique_pieces}, "
          f"Inductor compiles {c.inductor_compiles}, cache hits {c.cache_hits}, "
          f"graph breaks {c.graph_breaks}")
    for name, n in sorted(c.pass_matches.items()):
        print(f"  pass {name}: {n} matches")
    for stage, secs in {**engine.startup_seconds, **c.stage_seconds}.items():
        print(f"  {stage:<34} {secs:8.2f} s")
    if engine.cudagraph_batch_sizes:
        print(f"  CUDA graphs for batch sizes {engine.cudagraph_batch_sizes}")
    for kind, secs in engine.cudagraph_capture_seconds.items():
        print(f"  capture {kind:<26} {secs:8.2f} s")
    return 0


def run_cache(ns: argparse.Namespace) -> int:
    from compiled_llm.compile import cache

    if ns.action == "clear":
        print(f"removed {cache.clear(ns.cache_dir)} cache entries")
        return 0
    for e in cache.list_entries(ns.cache_dir):
        print(f"{e['key']}  {e['pieces']} pieces  {e['bytes'] / 1e6:.1f} MB  {e['info']}")
    return 0


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1")
    p.add_argument("--served-model-name", default=None,
                   help="model name clients must use (default: --model, or 'demo')")
    p.add_argument("--max-body-bytes", type=int, default=16 << 20)
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_serve)


def run_serve(ns: argparse.Namespace) -> int:
    import logging

    from compiled_llm.entrypoints.server.app import ServerConfig, serve

    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    cfg = ServerConfig(ns.served_model_name or ns.model or "demo", ns.api_key, ns.max_body_bytes)
    serve(engine_args(ns), ns.host, ns.port, cfg, ns.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compiled-llm")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _compile_parser(sub)
    _serve_parser(sub)
    ns = parser.parse_args(argv)
    try:
        return ns.func(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
