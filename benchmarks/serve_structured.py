"""Structured-output overhead: the same prompts at --max-concurrency (32) against one server,
unconstrained and then constrained by a JSON schema (xgrammar bitmask every step); prints both
and the ratio of output tokens/s and TPOT.

    python -m benchmarks.serve_structured --num-prompts 128 --result-file out/structured.json

The schema is an array of exactly --items one-digit integers. The unconstrained run then
asks each request for exactly as many tokens as its constrained output had, so both runs
generate the same tokens per request; each kind runs --repeats times, interleaved as
J P P J J P ..., and the best run of each kind is reported (the machine may be shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from benchmarks.common import print_table
from benchmarks.serve import add_args, random_dataset, run_load, serving, summarize, vocab_size


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


def run_keeping_lengths(base_url, model, data, ns, extra) -> tuple[dict, list[int]]:
    results, secs = asyncio.run(run_load(base_url, model, data, ns.request_rate,
                                         ns.max_concurrency, extra, ns.seed))
    return summarize(results, secs), [max(1, r.output_tokens) for r in results]


def _keep_best(runs: dict, name: str, summary: dict) -> None:
    if name not in runs or summary["output_throughput"] > runs[name]["output_throughput"]:
        runs[name] = summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.set_defaults(max_concurrency=32, num_prompts=128, random_output_len=64)
    ns = ap.parse_args()
    base_url, model, proc = serving(ns)
    guided = {"guided_json": schema(ns.items), "max_tokens": 8 * ns.items}
    try:
        data = random_dataset(ns.num_prompts, ns.random_input_len, ns.random_output_len,
                              ns.random_range_ratio, vocab_size(ns.tokenizer or model), ns.seed)
        run = lambda d, extra: summarize(*asyncio.run(run_load(  # noqa: E731
            base_url, model, d, ns.request_rate, ns.max_concurrency, extra, ns.seed)))
        run(data[:8], guided)  # warm-up: compiles the grammar
        summary, lengths = run_keeping_lengths(base_url, model, data, ns, guided)
        runs: dict[str, dict] = {"json schema": summary}
        matched = [(prompt, n) for (prompt, _), n in zip(data, lengths)]
        # then plain, plain, json, json, plain, ...: drift in machine load hits both alike
        for i in range(2 * ns.repeats - 1):
            if i % 4 in (0, 1):
                _keep_best(runs, "plain", run(matched, None))
            else:
                _keep_best(runs, "json schema", run(data, guided))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    rows = [{"run": k, "requests": v["completed"], "output tok/s": v["output_throughput"],
             "mean TPOT ms": v["mean_tpot_ms"], "p99 ITL ms": v["p99_itl_ms"],
             "mean TTFT ms": v["mean_ttft_ms"]} for k, v in runs.items()]
    print_table(rows, f"structured-output overhead at concurrency {ns.max_concurrency}")
    plain, constrained = runs["plain"], runs["json schema"]
    ratio = constrained["output_throughput"] / plain["output_throughput"]
    tpot = constrained["mean_tpot_ms"] / plain["mean_tpot_ms"]
    print(f"\njson-schema / plain: output tok/s x{ratio:.3f} "
          f"(overhead {100 * (1 - ratio):.1f}%), mean TPOT x{tpot:.3f}")
    host_ms = grammar_step_ms(model, ns.tokenizer, ns.items, ns.max_concurrency)
    print(f"grammar host work per decode step at {ns.max_concurrency} rows: {host_ms:.2f} ms "
          f"({100 * host_ms / plain['mean_tpot_ms']:.1f}% of the plain run's mean TPOT)")
    if ns.result_file:
        Path(ns.result_file).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.result_file).write_text(json.dumps(
            {"config": vars(ns), "runs": runs, "throughput_ratio": ratio, "tpot_ratio": tpot,
             "grammar_step_ms": host_ms},
            indent=2, default=str))


if __name__ == "__main__":
    main()
