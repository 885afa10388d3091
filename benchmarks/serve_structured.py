"""Structured-output overhead: the same prompts at --max-concurrency (32) against one server,
unconstrained and then constrained by a JSON schema (xgrammar bitmask every step); prints both
and the ratio of output tokens/s and TPOT.

    python -m benchmarks.serve_structured --num-prompts 128 --result-filename out/structured.json

The schema is an array of exactly --items one-digit integers. The unconstrained run then
asks each request for exactly as many tokens as its constrained output had, so both runs
generate the same tokens per request; each kind runs --repeats times, interleaved as
J P P J J P ..., and the best run of each kind is reported (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import print_table
from benchmarks.serve import add_args, serving, stop
from compiled_llm.entrypoints.cli.bench_datasets import random_requests
from compiled_llm.entrypoints.cli.bench_serve import load_tokenizer, request_bodies, run_load


def schema(items: int) -> dict:
    return {"type": "array", "minItems": items, "maxItems": items,
            "items": {"type": "integer", "minimum": 0, "maximum": 9}}


def grammar_step_ms(model: str, tokenizer: str | None, items: int, rows: int) -> float:
    """Host time per decode step of the grammar work alone for `rows` constrained requests:
    fill the batch bitmask, apply it to [rows, V] logits, accept each row's argmax token."""
    import time

    import torch
    from transformers import AutoConfig, AutoTokenizer

    from compiled_llm.sample.structured_outputs import (
        GrammarManager,
        StructuredOutputsParams,
        apply_bitmask,
        fill_bitmask,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer or model)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    mgr = GrammarManager(tok, vocab, (tok.eos_token_id,))
    spec = StructuredOutputsParams(json=schema(items))

    class Row:
        def __init__(self) -> None:
            self.grammar = mgr.matcher(spec)

    batch = [Row() for _ in range(rows)]
    gen = torch.Generator().manual_seed(0)
    steps, start = 0, time.perf_counter()
    while not all(r.grammar.is_terminated() for r in batch):
        logits = torch.randn(rows, vocab, generator=gen)
        bitmask, idx = fill_bitmask(batch, vocab)
        apply_bitmask(logits, bitmask, idx)
        for r, t in zip(batch, logits.argmax(-1).tolist()):
            if not r.grammar.is_terminated():
                r.grammar.accept_token(t)
        steps += 1
    return (time.perf_counter() - start) * 1000 / steps


def run(ns, data, **fields) -> dict:
    """bench serve's summary of one load of data, greedy with ignore_eos, plus `fields`."""
    bodies = request_bodies(data, ns.model, False, temperature=0.0, ignore_eos=True, **fields)
    return run_load(ns.base_url, "/v1/completions", bodies, ns.num_client_processes,
                    ns.max_concurrency, ns.request_rate, ns.seed)


def _keep_best(runs: dict, name: str, summary: dict) -> None:
    if name not in runs or summary["output_throughput"] > runs[name]["output_throughput"]:
        runs[name] = summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.set_defaults(max_concurrency=32, num_prompts=128, random_input_len=128,
                    random_range_ratio=0.5)
    ns = ap.parse_args()
    proc = serving(ns)
    try:
        vocab = len(load_tokenizer(ns.tokenizer or ns.model))
        data = random_requests(ns.num_prompts, ns.random_input_len, 8 * ns.items,
                               ns.random_range_ratio, vocab, ns.seed)
        guided = {"guided_json": schema(ns.items)}
        run(ns, data[:8], **guided)  # warm-up: compiles the grammar
        summary = run(ns, data, **guided)
        runs: dict[str, dict] = {"json schema": summary}
        lengths = [max(1, n) for n in summary["output_lens"]]
        matched = [(prompt, n) for (prompt, _), n in zip(data, lengths)]
        # then plain, plain, json, json, plain, ...: drift in machine load hits both alike
        for i in range(2 * ns.repeats - 1):
            if i % 4 in (0, 1):
                _keep_best(runs, "plain", run(ns, matched))
            else:
                _keep_best(runs, "json schema", run(ns, data, **guided))
    finally:
        stop(proc)
    rows = [{"run": k, "requests": v["completed"], "output tok/s": v["output_throughput"],
             "mean TPOT ms": v["mean_tpot_ms"], "p99 ITL ms": v["p99_itl_ms"],
             "mean TTFT ms": v["mean_ttft_ms"]} for k, v in runs.items()]
    print_table(rows, f"structured-output overhead at concurrency {ns.max_concurrency}")
    plain, constrained = runs["plain"], runs["json schema"]
    ratio = constrained["output_throughput"] / plain["output_throughput"]
    tpot = constrained["mean_tpot_ms"] / plain["mean_tpot_ms"]
    print(f"\njson-schema / plain: output tok/s x{ratio:.3f} "
          f"(overhead {100 * (1 - ratio):.1f}%), mean TPOT x{tpot:.3f}")
    host_ms = grammar_step_ms(ns.model, ns.tokenizer, ns.items, ns.max_concurrency)
    print(f"grammar host work per decode step at {ns.max_concurrency} rows: {host_ms:.2f} ms "
          f"({100 * host_ms / plain['mean_tpot_ms']:.1f}% of the plain run's mean TPOT)")
    if ns.result_filename:
        path = Path(ns.result_dir or ".") / ns.result_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            {"config": vars(ns), "throughput_ratio": ratio,
             "runs": {k: {m: x for m, x in v.items() if not isinstance(x, list)}
                      for k, v in runs.items()}, "tpot_ratio": tpot,
             "grammar_step_ms": host_ms},
            indent=2, default=str))


if __name__ == "__main__":
    main()
