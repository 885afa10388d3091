"""Engine lifecycle in one process, the collector off: memory at start, built (defaults, CUDA
graphs on), generated, shut down, deleted; a second LLM once the first is gone (dropped only);
two LLMs at once (0.4 of the device each). Exit code 1 unless every LLM gives the first one's
greedy tokens, dropped engines are freed at once, and memory is back within --tolerance-gb of
the start after each shutdown or drop. On CPU the memory columns are the process's RSS.

    python -m benchmarks.lifecycle --checkpoint-dir /tmp/ckpt                  # qwen3-0.6b
    python -m benchmarks.lifecycle --shape cpu-small --compile-mode none --new-tokens 4
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import weakref
from pathlib import Path

import torch

from benchmarks.common import (
    SHAPES,
    default_dtype,
    finish,
    print_table,
    random_ids,
    shape_checkpoint,
)
from benchmarks.ours import make_llm

GB = 1 << 30
MEMORY = ("allocated GB", "reserved GB", "used GB")  # checked against the start
CPU_KV_BYTES = 64 << 20  # CPU engines otherwise take 1 GiB of KV cache each


def memory() -> dict[str, float]:
    """GB allocated and reserved by PyTorch, used and free on the device (CUDA); on CPU the
    first three are the process's RSS and free is the system's available memory."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return {"allocated GB": torch.cuda.memory_allocated() / GB,
                "reserved GB": torch.cuda.memory_reserved() / GB,
                "used GB": (total - free) / GB, "free GB": free / GB}
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    rss = os.sysconf("SC_PAGE_SIZE") * pages / GB
    return {"allocated GB": rss, "reserved GB": rss, "used GB": rss,
            "free GB": os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB}


class Phases:
    """The table's rows: one per phase, with memory, seconds since the last row, and checks."""

    def __init__(self, shape: str, tolerance_gb: float) -> None:
        self.shape, self.tolerance = shape, tolerance_gb
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self._t = time.perf_counter()

    def mark(self, phase: str, back: bool = False, tokens_match: bool | None = None,
             dropped: weakref.ref | None = None) -> None:
        """Record a phase; back=True checks memory is within the tolerance of the start,
        dropped (a weak reference to an engine just deleted) that nothing still holds it."""
        now = time.perf_counter()
        row = {"shape": self.shape, "phase": phase, **memory(), "seconds": now - self._t,
               "back": "", "tokens": "" if tokens_match is None else
               ("match" if tokens_match else "DIFFER"),
               "engine freed": "" if dropped is None else ("yes" if dropped() is None else "NO")}
        if row["engine freed"] == "NO":
            self.failures.append(f"{self.shape} {phase}: the engine is still alive")
        if back:
            over = [k for k in MEMORY if row[k] - self.rows[0][k] > self.tolerance]
            row["back"] = "no: " + ", ".join(over) if over else "yes"
            self.failures += [f"{self.shape} {phase}: {k} not back" for k in over]
        if tokens_match is False:
            self.failures.append(f"{self.shape} {phase}: greedy tokens differ")
        self.rows.append(row)
        self._t = time.perf_counter()


def build(args, model_dir: str, **kw):
    """An LLM of the run's settings; kw override them (gpu_memory_utilization)."""
    if not torch.cuda.is_available():
        kw.setdefault("kv_cache_memory_bytes", CPU_KV_BYTES)
    return make_llm(model_dir, args.dtype, args.compile_mode, args.cudagraph_mode, **kw)


def greedy(llm, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from compiled_llm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def run_shape(shape: str, args) -> Phases:
    """Every phase for one checkpoint shape, in one process."""
    model_dir = shape_checkpoint(shape, args.checkpoint_dir)
    prompts = random_ids(args.num_prompts, args.prompt_len, SHAPES[shape]["vocab_size"])
    phases = Phases(shape, args.tolerance_gb)
    phases.mark("start")
    llm = build(args, model_dir)
    phases.mark("built")
    want = greedy(llm, prompts, args.new_tokens)
    phases.mark("generated")
    llm.shutdown()
    phases.mark("shut down", back=True)
    engine = weakref.ref(llm.engine)
    del llm  # no gc.collect
    phases.mark("deleted", back=True, dropped=engine)
    second_run(args, model_dir, prompts, want, phases)
    two_at_once(args, model_dir, prompts, want, phases)
    phases.mark(f"gc.collect() found {gc.collect()} objects", back=True)
    return phases


def second_run(args, model_dir: str, prompts, want, phases: Phases) -> None:
    """A second LLM once the first is gone; dropped without shutdown (empty_cache only)."""
    llm = build(args, model_dir)
    phases.mark("second built")
    phases.mark("second generated", tokens_match=greedy(llm, prompts, args.new_tokens) == want)
    engine = weakref.ref(llm.engine)
    del llm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    phases.mark("second deleted + empty_cache", back=True, dropped=engine)


def two_at_once(args, model_dir: str, prompts, want, phases: Phases) -> None:
    """Two LLMs alive together, 0.4 of the device each, both generating."""
    first = build(args, model_dir, gpu_memory_utilization=0.4)
    second = build(args, model_dir, gpu_memory_utilization=0.4)
    phases.mark("two built")
    match = [greedy(llm, prompts, args.new_tokens) == want for llm in (first, second)]
    phases.mark("two generated", tokens_match=all(match))
    first.shutdown()
    second.shutdown()
    phases.mark("two shut down", back=True)


def panel(rows: list[dict]):
    """A draw function: allocated and reserved GB per phase, one bar group per row."""
    def _draw(plt):
        fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4))
        xs = range(len(rows))
        for offset, key in ((-0.2, "allocated GB"), (0.2, "reserved GB")):
            ax.bar([x + offset for x in xs], [r[key] for r in rows], width=0.4, label=key)
        ax.set_xticks(list(xs), [f"{r['shape']}\n{r['phase']}" for r in rows], fontsize=6,
                      rotation=30)
        ax.set(title="engine lifecycle: memory per phase", ylabel="GB")
        ax.legend()
        return fig
    return _draw


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs="+", default=["qwen3-0.6b"], choices=list(SHAPES))
    ap.add_argument("--checkpoint-dir", default=None,
                    help="reuse or create the random checkpoints here, one folder per shape")
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--compile-mode", default="backend", choices=["backend", "stock", "none"])
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tolerance-gb", type=float, default=1.0)
    ap.add_argument("--json", default=None, help="default: bench_out/lifecycle_<device>.json")
    ap.add_argument("--plot", default=None, help="default: the JSON path with .png")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    import compiled_llm.entrypoints.llm  # noqa: F401  (its imports are not the engine's memory)

    if torch.cuda.is_available():
        torch.empty(1, device="cuda")  # the CUDA context is part of the start, not the engine
    gc.disable()  # what comes back, reference counting gave back (a last row runs gc.collect)
    results = [run_shape(shape, args) for shape in args.shape]
    rows = [r for p in results for r in p.rows]
    failures = [f for p in results for f in p.failures]
    print_table(rows, f"Engine lifecycle, {args.compile_mode}, {args.dtype}: memory per phase "
                f"(back = within {args.tolerance_gb} GB of the start)")
    finish("lifecycle", args, {"rows": rows, "failures": failures}, panel(rows))
    for failure in failures:
        print(f"FAIL {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
