"""The sampler alone on the GPU: a step's logits [B, V] to tokens, the general path (temperature,
min-p, top-k/p by sort, softmax, draw) against the sort-free fused kernel
(COMPILED_LLM_FUSED_TOPK_SAMPLING=1), per batch size and parameter mix, CUDA-event timed.

    python -m benchmarks.sampler --vocab 151936 --batch-sizes 1 8 64 256 --json out.json
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import print_table, save_json
from compiled_llm.sample.metadata import SamplingMetadata
from compiled_llm.sample.sampler import Sampler

# (name, top_k, top_p, min_p) every row uses; temperature 0.6 throughout
MIXES = [("top_p 0.95", 0, 0.95, 0.0), ("top_k 50", 50, 1.0, 0.0),
         ("top_k 20 + top_p 0.8", 20, 0.8, 0.0), ("min_p 0.05", 0, 1.0, 0.05)]


def make_meta(batch: int, top_k: int, top_p: float, min_p: float) -> SamplingMetadata:
    """One step's metadata: every row sampled at temperature 0.6 with these cuts."""
    def full(value, dtype):
        return torch.full((batch,), value, dtype=dtype, device="cuda")

    return SamplingMetadata(
        temperature=full(0.6, torch.float32), all_greedy=False,
        top_k=full(top_k, torch.int64) if top_k else None,
        top_p=full(top_p, torch.float32) if top_p < 1.0 else None,
        min_p=full(min_p, torch.float32) if min_p else None, generators={},
        presence_penalty=None, frequency_penalty=None, repetition_penalty=None,
        output_token_ids=[[] for _ in range(batch)], banned_token_ids={},
        logits_processors={}, max_num_logprobs=None, max_top_k=top_k or None, any_greedy=False)


def time_ms(sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata, iters: int) -> float:
    """Mean milliseconds of one sampler call (after warm-up), CUDA events."""
    for _ in range(3):
        sampler(logits, meta)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        sampler(logits, meta)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run(vocab: int, batch_sizes: list[int], iters: int) -> list[dict]:
    general, fused = Sampler("cuda", vocab), Sampler("cuda", vocab)
    general.fused_cuts, fused.fused_cuts = "0", "1"  # never, always
    rows = []
    for batch in batch_sizes:
        logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16) * 3
        for name, top_k, top_p, min_p in MIXES:
            meta = make_meta(batch, top_k, top_p, min_p)
            sort_ms = time_ms(general, logits, meta, iters)
            fused_ms = time_ms(fused, logits, meta, iters)
            rows.append({"batch": batch, "params": name, "general ms": sort_ms,
                         "fused ms": fused_ms, "general / fused": sort_ms / fused_ms})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = run(args.vocab, args.batch_sizes, args.iters)
    device = torch.cuda.get_device_name()
    print_table(rows, f"sampler, vocab {args.vocab}, temperature 0.6 ({device})")
    save_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
