"""Offline throughput: N requests of random prompt lengths, output tokens/s, against
transformers' generate on the same checkpoint in the same run.

    python benchmarks/throughput.py --shape cpu-small --num-requests 64
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from benchmarks.common import print_table, random_checkpoint, save_json, timed


def workload(n: int, vocab: int, in_range, out_range, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(*in_range))] for _ in range(n)]
    outs = [rng.randint(*out_range) for _ in range(n)]
    return prompts, outs


def run_ours(model_dir, prompts, outs, dtype, **kw) -> float:
    from compiled_llm import LLM, SamplingParams

    llm = LLM(str(model_dir), dtype=dtype, skip_tokenizer_init=True, **kw)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate([{"prompt_token_ids": prompts[0]}], params[0], use_tqdm=False)  # warm
    res, secs = timed(lambda: llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                           use_tqdm=False))
    assert sum(len(r.outputs[0].token_ids) for r in res) == sum(outs)
    return sum(outs) / secs


def run_hf(model_dir, prompts, outs, dtype, batch: int) -> float:
    """transformers generate, static left-padded batches of `batch`, each to its longest output."""
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    total = 0.0
    for i in range(0, len(prompts), batch):
        ps, os_ = prompts[i : i + batch], outs[i : i + batch]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)
        o = max(os_)
        _, secs = timed(lambda ids=ids, mask=mask, o=o: model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=o, min_new_tokens=o,
            do_sample=False, pad_token_id=0))
        total += secs
    return sum(outs) / total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cpu-small")
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, nargs=2, default=[16, 256])
    ap.add_argument("--output-len", type=int, nargs=2, default=[16, 128])
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--modes", nargs="+", default=["eager", "stock"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    model_dir = args.model or random_checkpoint(args.shape, dtype)
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    prompts, outs = workload(args.num_requests, vocab, args.input_len, args.output_len)
    hf = run_hf(model_dir, prompts, outs, dtype, args.hf_batch)
    rows = [{"engine": "transformers generate", "output tok/s": hf, "ratio": 1.0}]
    for mode in args.modes:
        kw = {"enforce_eager": True} if mode == "eager" else {"compile_mode": mode}
        tps = run_ours(model_dir, prompts, outs, args.dtype, **kw)
        rows.append({"engine": f"compiled-llm ({mode})", "output tok/s": tps, "ratio": tps / hf})
    print_table(rows, f"Offline throughput, {args.num_requests} requests, shape {args.shape}")
    save_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
