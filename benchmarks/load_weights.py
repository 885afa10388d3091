"""Weight loading onto the GPU: `load_model` reading safetensors through pinned staging buffers
(COMPILED_LLM_PINNED_LOAD=1, worker/weight_reader.py) against safetensors' own per-tensor reads
(=0), in alternating order, each round a fresh process (fresh CUDA context and allocator), after
one untimed read of the files has put them in the page cache (warm start-up).

    python -m benchmarks.load_weights --checkpoint-dir /tmp/ckpt/llama3-8b --json out.json

A folder without config.json gets a random checkpoint of --shape first. Each child also times
iter_tensors alone (the reading, without building the model) after its load_model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import print_table, random_checkpoint, save_json

PATHS = {"1": "pinned staging", "0": "safe_open"}
# load_model's lazy imports (Triton kernels among them, ~2 s): imported before the clock starts
LAZY_IMPORTS = ["compiled_llm.quantization.fp8", "compiled_llm.quantization.loading",
                "compiled_llm.quantization.w4a16", "compiled_llm.worker.fuse_weights",
                "compiled_llm.worker.shared_overlap"]
RESULT_PREFIX = "LOAD_WEIGHTS_RESULT "


def warm_page_cache(files: list[Path], chunk: int = 64 << 20) -> float:
    """Read every file once (untimed for the rows); the seconds it took."""
    started = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(chunk):
                pass
    return time.perf_counter() - started


def child(model_dir: str, dtype_name: str, max_len: int) -> None:
    """One timed load_model (and one iter_tensors pass) in this fresh process; prints JSON."""
    import importlib

    from compiled_llm.worker.loader import checkpoint_files, iter_tensors, load_model

    started = time.perf_counter()
    for module in LAZY_IMPORTS:
        importlib.import_module(module)
    import_s = time.perf_counter() - started
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)  # the CUDA context is not part of the load
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    model = load_model(model_dir, getattr(torch, dtype_name), device, max_len)
    sync()
    load_s = time.perf_counter() - started
    files = checkpoint_files(Path(model_dir), "auto")
    started = time.perf_counter()
    for _ in iter_tensors(files, device):
        pass
    sync()
    read_s = time.perf_counter() - started
    params = sum(param.numel() * param.element_size() for param in model.parameters())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(RESULT_PREFIX + json.dumps({"load_s": load_s, "read_s": read_s, "device": name,
                                      "import_s": import_s, "param_bytes": params,
                                      "peak_gpu_bytes": peak}))


def run_child(model_dir: str, switch: str, args: argparse.Namespace) -> dict:
    """A fresh process timing one load with COMPILED_LLM_PINNED_LOAD=switch; its result."""
    env = {**os.environ, "COMPILED_LLM_PINNED_LOAD": switch}
    cmd = [sys.executable, "-m", "benchmarks.load_weights", "--child", model_dir,
           "--dtype", args.dtype, "--max-len", str(args.max_len)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"load child ({PATHS[switch]}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix(RESULT_PREFIX))


def summary_rows(rows: list[dict], file_bytes: int) -> list[dict]:
    """Per path: best and mean load seconds, GB/s of the best, and speed-up over safe_open."""
    best = {path: min(row["load s"] for row in rows if row["path"] == path)
            for path in PATHS.values()}
    out = []
    for path in PATHS.values():
        times = [row["load s"] for row in rows if row["path"] == path]
        out.append({"path": path, "best load s": best[path],
                    "mean load s": sum(times) / len(times),
                    "best GB/s": file_bytes / best[path] / 1e9,
                    "speed-up": best["safe_open"] / best[path]})
    return out


def main() -> None:
    """Make or reuse the checkpoint, warm the page cache, time both paths alternately."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint-dir", default="/tmp/ckpt/llama3-8b",
                    help="the model folder itself (made from --shape when it has no config)")
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.dtype, args.max_len)
        return
    model_dir = Path(args.checkpoint_dir)
    if not (model_dir / "config.json").exists():
        random_checkpoint(args.shape, getattr(torch, args.dtype), out=str(model_dir))
    files = sorted(model_dir.glob("*.safetensors"))
    file_bytes = sum(path.stat().st_size for path in files)
    warm_s = warm_page_cache(files)
    print(f"{len(files)} files, {file_bytes / 1e9:.2f} GB; page-cache warm-up read "
          f"{warm_s:.2f} s ({file_bytes / warm_s / 1e9:.1f} GB/s)")
    if not torch.cuda.is_available():  # no CUDA context is made here: children own theirs
        print("no CUDA device: both rows read through safetensors (the pinned path is CUDA's)")
    rows, raw = [], []
    for round_number in range(args.rounds):
        for switch in ("1", "0") if round_number % 2 == 0 else ("0", "1"):
            res = run_child(str(model_dir), switch, args)
            raw.append({"switch": switch, "round": round_number, **res})
            rows.append({"round": round_number, "path": PATHS[switch], "load s": res["load_s"],
                         "GB/s": file_bytes / res["load_s"] / 1e9,
                         "iter_tensors s": res["read_s"],
                         "peak GPU GB": res["peak_gpu_bytes"] / 1e9})
    print_table(rows, f"load_model, {model_dir.name} ({raw[0]['device']}), each a fresh process")
    summary = summary_rows(rows, file_bytes)
    print_table(summary, "best of the rounds")
    save_json(args.json or f"bench_out/load_weights_{model_dir.name}.json",
              {"device": raw[0]["device"], "checkpoint": str(model_dir), "file_bytes": file_bytes,
               "warm_read_s": warm_s, "args": vars(args), "rows": rows, "summary": summary,
               "raw": raw})


if __name__ == "__main__":
    main()
