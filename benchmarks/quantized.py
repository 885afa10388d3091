"""Quantized checkpoints on the GPU (issue 19): Llama-3-8B shape with random weights, packed in
this script into W4A16 (compressed-tensors pack-quantized, group 128) and block FP8 (128x128,
DeepSeek/Qwen layout), each against bf16 in the same call: batch-1 and batch-64 decode tok/s
in timed windows, then the user's path (`LLM(model=DIR)` with defaults): batch-1 decode and the
nano-vllm workload (each engine in its own process), and the checkpoint's weight bytes. Goal:
W4A16 >= 2.5x bf16 at batch 1.

    python -m benchmarks.quantized --checkpoint-dir /tmp/ckpt --output-json out.json
    python -m benchmarks.quantized --checkpoint-dir /tmp/ckpt --skip-windows --batch-sizes 1 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks import isolate
from benchmarks.common import print_table, save_json, shape_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
W4A16_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                  "format": "pack-quantized",
                                  "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                              "group_size": 128, "symmetric": True,
                                              "dynamic": False, "actorder": None}}},
}
FP8_BLOCK_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}


def pack_w4a16(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized tensors of weight [N, K]: symmetric int4 per 128."""
    from compiled_llm.quantization.packing import pack_int4

    n, k = weight.shape
    groups = weight.float().reshape(n, k // 128, 128)
    scale = (groups.abs().amax(-1) / 7).clamp(min=1e-8)
    q = (torch.round(groups / scale[..., None]).clamp(-8, 7) + 8).to(torch.uint8)
    return {"weight_packed": pack_int4(q.reshape(n, k)),
            "weight_scale": scale.to(torch.bfloat16),
            "weight_shape": torch.tensor([n, k], dtype=torch.int64)}


def pack_fp8_block(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """e4m3 weight [N, K] with weight_scale_inv per 128x128 block (K a multiple of 128)."""
    n, k = weight.shape
    rows = -(-n // 128)
    padded = torch.nn.functional.pad(weight.float(), (0, 0, 0, rows * 128 - n))
    blocks = padded.reshape(rows, 128, k // 128, 128)
    scale = (blocks.abs().amax((1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).reshape(-1, k)[:n].to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}


PACKERS = {"w4a16": (pack_w4a16, W4A16_CONFIG), "fp8-block": (pack_fp8_block, FP8_BLOCK_CONFIG)}


def pack_file(path: Path, pack) -> dict[str, torch.Tensor]:
    """One safetensors file's tensors (on the CPU) with every linear in LINEARS packed (read
    on the GPU where there is one); routers, norms, embeddings and the LM head as stored."""
    from safetensors.torch import load_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(str(path), device=device).items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS:
            out.update({f"{prefix}.{k}": v.cpu() for k, v in pack(tensor).items()})
        else:
            out[name] = tensor.cpu()
    return out


def quantized_checkpoint(bf16_dir: str, fmt: str) -> str:
    """bf16_dir's weights packed as `fmt` into a sibling directory (made once)."""
    from safetensors.torch import save_file

    out = Path(f"{bf16_dir}-{fmt}")
    if (out / "config.json").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    pack, qconfig = PACKERS[fmt]
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(bf16_dir).glob("*.safetensors")):
        tensors.update(pack_file(path, pack))
    save_file(tensors, str(out / "model.safetensors"))
    del tensors
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the packing's GPU memory goes back before the engines start
    for name in TOKENIZER_FILES:  # the user's path detokenizes
        if (Path(bf16_dir) / name).exists():
            (out / name).write_bytes((Path(bf16_dir) / name).read_bytes())
    config = json.loads((Path(bf16_dir) / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": qconfig}))
    return str(out)


def user_path(model_dir: str, gpu_memory_utilization: float, batch_sizes=(1,)) -> dict:
    """`LLM(model=DIR)` with defaults (the memory share aside): decode at each batch size (a
    128-token prompt each, greedy), then the nano-vllm workload (temperature 0.6, detokenized)."""
    from benchmarks.user_path import run_decode, run_nano_vllm
    from compiled_llm import LLM, SamplingParams

    llm = LLM(model=model_dir, gpu_memory_utilization=gpu_memory_utilization)
    decode = {str(b): run_decode(llm, SamplingParams, new_tokens=128, batch=b)
              for b in batch_sizes}
    return {"decode": decode, "nano_vllm": run_nano_vllm(llm, SamplingParams)}


def weight_gb(model_dir: str) -> float:
    """Bytes of the checkpoint's weight files, in GB."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors")) / 1e9


def main() -> None:
    """Make the checkpoints, run each format's decode windows, print and save the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--formats", nargs="+", default=["bf16", "w4a16", "fp8-block"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--compile-mode", default="backend")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--output-json", default=None)
    ap.add_argument("--skip-user-path", action="store_true",
                    help="leave out the default-settings engine (b1 decode, nano-vllm)")
    ap.add_argument("--skip-windows", action="store_true",
                    help="leave out the timed decode windows (the user's path alone: one "
                         "engine per format, its decode at every --batch-sizes value)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8,
                    help="every format's engine (the same for all: a fair KV budget)")
    args = ap.parse_args()
    bf16_dir = shape_checkpoint(args.shape, args.checkpoint_dir, tokenizer=True)
    rows, user_rows = [], []
    for fmt in args.formats:
        model_dir = bf16_dir if fmt == "bf16" else quantized_checkpoint(bf16_dir, fmt)
        if not args.skip_windows:
            rows += window_rows(fmt, model_dir, args)
        if not args.skip_user_path:
            res = isolate.call("benchmarks.quantized:user_path", model_dir=model_dir,
                               gpu_memory_utilization=args.gpu_memory_utilization,
                               batch_sizes=args.batch_sizes)
            user_rows.append({**user_row(fmt, res, args.batch_sizes),
                              "weight GB": weight_gb(model_dir)})
        finish(args, rows, user_rows)


def window_rows(fmt: str, model_dir: str, args: argparse.Namespace) -> list[dict]:
    """One row per batch size: the timed decode windows of one format's engine."""
    res = isolate.call("benchmarks.ours:decode", model_dir=model_dir, dtype="bfloat16",
                       compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                       batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                       new_tokens=args.new_tokens,
                       engine_kw={"gpu_memory_utilization": args.gpu_memory_utilization})
    by_batch = {row["batch"]: row for row in res.get("rows", [])}
    return [{"format": fmt, "batch": batch, "weight GB": weight_gb(model_dir),
             "tok_s": by_batch.get(batch, {}).get("tok_s"),
             "ms_per_step": by_batch.get(batch, {}).get("ms_per_step"),
             "x bf16": None, "error": res.get("error")} for batch in args.batch_sizes]


def user_row(fmt: str, res: dict, batch_sizes: list[int]) -> dict:
    """One format's user-path figures: decode tok/s per batch size, nano-vllm output tok/s."""
    decode = res.get("decode", {})
    row = {"format": fmt, "weight GB": None}
    row.update({f"b{b} tok_s": decode.get(str(b), {}).get("tok_s") for b in batch_sizes})
    row["nano-vllm out tok_s"] = res.get("nano_vllm", {}).get("output_tok_s")
    row["error"] = res.get("error")
    return row


def _ratios(rows: list[dict], key: str, out_key: str, group: str | None = None) -> None:
    """rows[out_key] = rows[key] over bf16's (bf16's row of the same `group` value)."""
    base = {r.get(group): r[key] for r in rows if r["format"] == "bf16"}
    for r in rows:
        known = r.get(key) and base.get(r.get(group))
        r[out_key] = r[key] / base[r.get(group)] if known else None


def finish(args: argparse.Namespace, rows: list[dict], user_rows: list[dict]) -> None:
    """Ratios against bf16, the tables, and the JSON (written after every format)."""
    _ratios(rows, "tok_s", "x bf16", group="batch")
    for batch in args.batch_sizes:
        _ratios(user_rows, f"b{batch} tok_s", f"b{batch} x bf16")
    _ratios(user_rows, "nano-vllm out tok_s", "nano-vllm x bf16")
    save_json(args.output_json, {"shape": args.shape, "args": vars(args), "rows": rows,
                                 "user_path": user_rows})
    if rows:
        print_table(rows, f"quantized decode windows, {args.shape}")
    if user_rows:
        print_table(user_rows, f"quantized, the user's path (LLM defaults), {args.shape}")

if __name__ == "__main__":
    main()
