"""Multi-LoRA overhead: decode throughput of requests running with adapters (4 adapters of rank
16 on every projection, spread evenly over the batch) against the base model in the same run,
at batch 1 and batch 64, on a random-weight model of Llama-3-8B's shape (made here). The base
figures come from an engine without LoRA and from base-model requests of the LoRA engine.

    python -m benchmarks.lora --output-json /tmp/lora.json           # H200: llama3-8b, bf16
    python -m benchmarks.lora --shape cpu-small --dtype float32 --output-len 8 --batch-sizes 1 4

Each phase writes the JSON as it ends, so a run cut short keeps the figures it has.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    SHAPES,
    default_dtype,
    device_name,
    print_table,
    random_ids,
    save_json,
    shape_checkpoint,
)

PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
               "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def make_adapters(shape: str, count: int, rank: int, dtype: torch.dtype) -> list[str]:
    """count random PEFT adapters (non-zero A and B) on every projection, saved; their dirs."""
    from safetensors.torch import save_file

    cfg = SHAPES[shape]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    q_size, kv_size = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    dims = {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}
    out = []
    for index in range(count):
        gen = torch.Generator().manual_seed(index)
        tensors = {}
        for layer in range(cfg["num_hidden_layers"]):
            for proj, (fan_in, fan_out) in dims.items():
                key = f"base_model.model.model.layers.{layer}.{PROJECTIONS[proj]}.{proj}"
                tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=gen)
                                                   * fan_in ** -0.5).to(dtype)
                tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=gen)
                                                   * 0.01).to(dtype)
        path = Path(tempfile.mkdtemp(prefix=f"bench-lora{index}-"))
        save_file(tensors, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
            "target_modules": list(PROJECTIONS)}))
        out.append(str(path))
    return out


def decode_rate(llm, batch: int, args, loras) -> dict:
    """Output tokens per second of `batch` requests (prompt, then output_len tokens each), the
    best of args.reps runs after a warm-up; loras: the LoRARequest of each (None: base)."""
    from compiled_llm import SamplingParams

    vocab = SHAPES[args.shape]["vocab_size"]
    prompts = [{"prompt_token_ids": p} for p in random_ids(batch, args.input_len, vocab)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    request_loras = None if loras is None else [loras[i % len(loras)] for i in range(batch)]
    llm.generate(prompts[:1], params, use_tqdm=False, lora_request=request_loras
                 and request_loras[:1])
    best = float("inf")
    for _ in range(args.reps):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=request_loras)
        best = min(best, time.perf_counter() - start)
    return {"seconds": best, "tok/s": batch * args.output_len / best}


def run_engine(model: str, args, lora_paths: list[str] | None, results: dict) -> None:
    """One engine's phases: base requests, and with lora_paths also adapter requests."""
    from compiled_llm import LLM, LoRARequest

    kwargs = dict(enable_lora=True, max_loras=len(lora_paths), max_lora_rank=args.rank) \
        if lora_paths else {}
    name = "lora engine" if lora_paths else "plain engine"
    start = time.perf_counter()
    with LLM(model, dtype=args.dtype, max_num_seqs=max(args.batch_sizes),
             max_model_len=args.input_len + args.output_len + 16,
             skip_tokenizer_init=True, **kwargs) as llm:
        results["startup_s"][name] = time.perf_counter() - start
        loras = [LoRARequest(f"bench{i}", i + 1, path) for i, path in enumerate(lora_paths or [])]
        for batch in args.batch_sizes:
            results["runs"][f"{name}, base, batch {batch}"] = decode_rate(llm, batch, args, None)
            if loras:
                key = f"{name}, {len(loras)} adapters, batch {batch}"
                results["runs"][key] = decode_rate(llm, batch, args, loras)
            save_json(args.output_json, results)


def summary(results: dict, args) -> list[dict]:
    """One row per batch size: tok/s of each phase and the LoRA overhead against each base."""
    runs, rows = results["runs"], []
    for batch in args.batch_sizes:
        lora = runs.get(f"lora engine, {args.adapters} adapters, batch {batch}")
        plain = runs.get(f"plain engine, base, batch {batch}")
        base_in_lora = runs.get(f"lora engine, base, batch {batch}")
        if lora is None:
            continue
        row = {"batch": batch, "lora tok/s": lora["tok/s"]}
        for label, base in (("plain", plain), ("lora-engine base", base_in_lora)):
            if base is not None:
                row[f"{label} tok/s"] = base["tok/s"]
                row[f"overhead vs {label} %"] = 100 * (base["tok/s"] / lora["tok/s"] - 1)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=list(SHAPES))
    ap.add_argument("--checkpoint-dir", default=None, help="reuse or create the checkpoint here")
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip-plain", action="store_true", help="no engine without LoRA")
    ap.add_argument("--output-json", default="bench_out/lora.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    results = {"device": device_name(), "torch": torch.__version__, "args": vars(args),
               "startup_s": {}, "runs": {}}
    start = time.perf_counter()
    model = shape_checkpoint(args.shape, args.checkpoint_dir, dtype)
    adapters = make_adapters(args.shape, args.adapters, args.rank, dtype)
    results["setup_s"] = time.perf_counter() - start
    if not args.skip_plain:
        run_engine(model, args, None, results)
    run_engine(model, args, adapters, results)
    results["summary"] = summary(results, args)
    save_json(args.output_json, results)
    print_table([{"phase": k, **v} for k, v in results["runs"].items()], "decode throughput")
    if results["summary"]:
        print_table(results["summary"], f"LoRA overhead ({args.adapters} adapters, rank "
                    f"{args.rank})")
    print(f"results: {args.output_json}")


if __name__ == "__main__":
    main()
