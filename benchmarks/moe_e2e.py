"""Mixture-of-experts end to end (issue 18): a Qwen3-30B-A3B-shaped checkpoint (48 layers, 128
experts, top-8, hidden 2048, expert width 768; random bf16 weights made in the run) and the
same weights in block FP8 (128x128, the Qwen3-FP8 per-expert layout), each against transformers
on the same checkpoint: batch-1 and batch-64 decode and a short nano-vllm-style workload. Every
engine runs in its own process; the JSON is rewritten after each phase.

    python -m benchmarks.moe_e2e --checkpoint-dir /tmp/ckpt --formats bf16 --output-json a.json
    python -m benchmarks.moe_e2e --checkpoint-dir /tmp/ckpt --formats fp8-block --output-json b.json
    python -m benchmarks.moe_e2e --shape cpu-moe --compile-mode none --new-tokens 4 \\
        --peer-new-tokens 6 --num-requests 4 --input-len 8 16 --output-len 4 8   # CPU smoke

transformers' MoE runs eagerly (its generate-compile of a 48-layer MoE does not fit the run),
with few tokens (--peer-new-tokens) and a time cap on its continuous batching. The FP8
checkpoint is converted shard by shard from the bf16 one (--drop-bf16 deletes each bf16 shard
once converted: the two do not fit a 64 GB disk together).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks import isolate
from benchmarks.common import default_dtype, print_table, save_json, shape_checkpoint
from benchmarks.quantized import FP8_BLOCK_CONFIG, pack_file, pack_fp8_block
from benchmarks.throughput import workload


def fp8_checkpoint(bf16_dir: str, drop_bf16: bool) -> str:
    """bf16_dir packed as block FP8 into `<bf16_dir>-fp8-block`, one shard at a time (made
    once); drop_bf16 deletes each bf16 shard after its FP8 twin is written."""
    from safetensors.torch import save_file

    src, out = Path(bf16_dir), Path(f"{bf16_dir}-fp8-block")
    if (out / "config.json").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors = pack_file(path, pack_fp8_block)  # every expert's and attention's linears
        save_file(tensors, str(out / path.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, path.name))
        del tensors
        if drop_bf16:
            path.unlink()
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config,
                                                 "quantization_config": FP8_BLOCK_CONFIG}))
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return str(out)


def _decode_rows(res: dict, engine: str, fmt: str) -> list[dict]:
    rows = [{"format": fmt, "engine": engine, "phase": f"decode b{r['batch']}",
             "tok/s": r["tok_s"], "ms/step": r["ms_per_step"]} for r in res.get("rows", [])]
    failed = {**res.get("failed", {})} | ({"all": res["error"]} if "error" in res else {})
    rows += [{"format": fmt, "engine": engine, "phase": f"decode b{b}", "tok/s": None,
              "ms/step": None, "error": err} for b, err in failed.items()]
    return rows


def _workload_row(res: dict, engine: str, fmt: str, requests: int) -> dict:
    if "error" in res:
        return {"format": fmt, "engine": engine, "phase": "nano-vllm", "tok/s": None,
                "ms/step": None, "error": res["error"]}
    done = res.get("finished", requests)
    return {"format": fmt, "engine": engine, "phase": "nano-vllm",
            "tok/s": res["output_tokens"] / res["seconds"], "ms/step": None,
            "finished": f"{done}/{requests}" + (" (capped)" if res.get("capped") else "")}


def run_format(fmt: str, model_dir: str, args, record) -> None:
    """The phases of one checkpoint (decode: ours, transformers; workload: ours,
    transformers); record(rows) after each."""
    common = dict(model_dir=model_dir, dtype=args.dtype)
    if "decode" in args.phases:
        _decode_phases(common, fmt, args, record)
    if "workload" in args.phases:
        _workload_phases(common, fmt, args, record)


def _decode_phases(common: dict, fmt: str, args, record) -> None:
    ours = isolate.call("benchmarks.ours:decode", **common, compile_mode=args.compile_mode,
                        cudagraph_mode=args.cudagraph_mode, batch_sizes=args.batch_sizes,
                        prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                        engine_kw={"gpu_memory_utilization": args.gpu_memory_utilization})
    record(_decode_rows(ours, "compiled-llm", fmt))
    if args.peer_new_tokens > 0:
        peer = isolate.call("benchmarks.hf_peer:static_decode", **common, compile_mode="none",
                            batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                            new_tokens=args.peer_new_tokens, budget_s=args.peer_budget_s)
        record(_decode_rows(peer, "transformers (eager)", fmt))


def _workload_phases(common: dict, fmt: str, args, record) -> None:
    vocab = json.loads(Path(common["model_dir"], "config.json").read_text())["vocab_size"]
    prompts, outs = workload(args.num_requests, vocab, args.input_len, args.output_len)
    ours = isolate.call("benchmarks.ours:offline", **common, prompts=prompts, outs=outs,
                        compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                        max_model_len=args.input_len[1] + args.output_len[1],
                        engine_kw={"gpu_memory_utilization": args.gpu_memory_utilization})
    record([_workload_row(ours, "compiled-llm", fmt, len(prompts))])
    if args.peer_max_seconds > 0:
        peer = isolate.call("benchmarks.hf_peer:continuous_batching", **common, prompts=prompts,
                            outs=outs, max_seconds=args.peer_max_seconds)
        record([_workload_row(peer, "transformers CB", fmt, len(prompts))])


def parse_args() -> argparse.Namespace:
    """The run's options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--formats", nargs="+", default=["bf16", "fp8-block"],
                    choices=["bf16", "fp8-block"])
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--phases", nargs="+", default=["decode", "workload"],
                    choices=["decode", "workload"], help="to split the run over calls")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--peer-new-tokens", type=int, default=12,
                    help="transformers' decode tokens, 4 more than it times (its MoE is slow; "
                         "0: no decode peer)")
    ap.add_argument("--peer-budget-s", type=float, default=45.0,
                    help="transformers' decode: batch sizes left once this has passed")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, nargs=2, default=[100, 512])
    ap.add_argument("--output-len", type=int, nargs=2, default=[50, 200])
    ap.add_argument("--peer-max-seconds", type=float, default=30.0,
                    help="cap on transformers' continuous batching (0: no workload peer)")
    ap.add_argument("--compile-mode", default="backend")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--drop-bf16", action="store_true",
                    help="delete the bf16 shards while making the FP8 checkpoint")
    ap.add_argument("--output-json", "--json", dest="output_json", default=None)
    return ap.parse_args()


def main() -> None:
    """Make the checkpoints as needed, run each format's phases, print and save the table."""
    args = parse_args()
    rows: list[dict] = []
    t0 = time.perf_counter()

    def record(new: list[dict]) -> None:
        rows.extend(new)
        save_json(args.output_json, {"shape": args.shape, "args": vars(args), "rows": rows,
                                     "elapsed_s": time.perf_counter() - t0})
        for row in new:
            print(json.dumps(row), flush=True)

    bf16_dir = shape_checkpoint(args.shape, args.checkpoint_dir)
    for fmt in args.formats:
        model_dir = bf16_dir if fmt == "bf16" else fp8_checkpoint(bf16_dir, args.drop_bf16)
        run_format(fmt, model_dir, args, record)
    print_table([{k: r.get(k) for k in ("format", "engine", "phase", "tok/s", "ms/step")}
                 for r in rows], f"MoE end to end, {args.shape}")


if __name__ == "__main__":
    main()
