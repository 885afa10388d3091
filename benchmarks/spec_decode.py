"""Speculative decoding (issue 16): greedy decode of a Llama-3-8B-shaped random model at batch 1
with spec off, n-gram prompt lookup, the target as its own draft model and a 2-layer draft of
the same shape (random weights: low acceptance, reported as it is); then batch 64 on prompts
without repetition, spec off against n-gram with disable_by_batch_size (the no-slowdown check;
`ngram_nolimit` runs it without the limit). Each engine runs in its own process. Prints a
table and writes JSON (--output-json) after every phase.

The draft = target case measures the machinery on a *peaked* checkpoint made here (see
peaked_checkpoint): its argmax has a margin no bf16 rounding flips, so every draft is accepted
and tokens per target step should be k+1. The copy-heavy workload is made here too: a prompt
that repeats one random span, whose copying answer continues the period. Random weights cannot
copy spans on purpose; what n-gram accepts on them is what their own repetition gives, and the
JSON says so. The quoting workload (`off_peaked`, `ngram_peaked`) runs on the peaked checkpoint,
which does copy: its prompt is a walk along the checkpoint's permutation, filler, then the
walk's first token, so the greedy answer quotes the prompt's first span (see quoting).
--configs runs a subset (to split the run over two calls).

    python -m benchmarks.spec_decode --checkpoint-dir /tmp/ckpt --output-json spec.json
    python -m benchmarks.spec_decode --shape cpu-small --new-tokens 16 --compile-mode none
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import isolate
from benchmarks.common import (
    SHAPES,
    default_dtype,
    device_name,
    print_table,
    random_ids,
    save_json,
    shape_checkpoint,
)
from benchmarks.ours import make_llm

CONFIGS = ("off", "ngram", "draft_self", "draft_2layer", "off_peaked", "ngram_peaked")
EXTRA_CONFIGS = ("ngram_nolimit",)  # run when named in --configs
_BRANCH_SCALE = 1e-4  # the peaked checkpoint's residual branches (o_proj, down_proj)


def _spec_counts(llm) -> dict[str, int]:
    names = {"vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    return {names[m.name]: m.value for m in llm.get_metrics() if m.name in names}


def _window(llm, prompts: list[list[int]], new_tokens: int) -> dict:
    """Decode tokens/s of greedy generation past the first token (a max_tokens=1 run of the
    same prompts is the prefill time taken off), target steps and acceptance."""
    from compiled_llm import SamplingParams

    batch = [{"prompt_token_ids": p} for p in prompts]
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    t = time.perf_counter()
    llm.generate(batch, first, use_tqdm=False)
    prefill = time.perf_counter() - t
    before, stats0 = _spec_counts(llm), llm.engine.step_stats
    t = time.perf_counter()
    outs = llm.generate(batch, full, use_tqdm=False)
    secs = time.perf_counter() - t - prefill
    steps = (llm.engine.step_stats - stats0).steps  # engine steps: one target forward each
    made = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    counts = {k: v - before.get(k, 0) for k, v in _spec_counts(llm).items()}
    row = {"batch": len(prompts), "decode_tok_s": made / secs,
           "tokens_per_target_step": made / len(prompts) / max(1, steps - 1)}
    if counts.get("drafts"):
        row["acceptance_rate"] = counts["accepted_tokens"] / max(1, counts["draft_tokens"])
        row["tokens_per_verify_step"] = 1 + counts["accepted_tokens"] / counts["drafts"]
        row.update(counts)
    if llm.engine.num_used_blocks:
        raise RuntimeError(f"{llm.engine.num_used_blocks} KV blocks still held after decode")
    return row


def run(model_dir: str, dtype: str, compile_mode: str, cudagraph_mode: str, spec: dict | None,
        workloads: dict[str, list[list[int]]], new_tokens: int, kv_bytes: int) -> dict:
    """One engine (spec config `spec`), one decode window per workload after a warm-up."""
    from compiled_llm import SamplingParams

    longest = max(len(p) for prompts in workloads.values() for p in prompts)
    t = time.perf_counter()
    llm = make_llm(model_dir, dtype, compile_mode, cudagraph_mode,
                   max_model_len=longest + new_tokens + 64, kv_cache_memory_bytes=kv_bytes,
                   max_num_seqs=max(64, *(len(p) for p in workloads.values())),
                   speculative_config=spec)
    startup = time.perf_counter() - t
    warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in next(iter(workloads.values()))[:1]], warm,
                 use_tqdm=False)
    rows = {name: _window(llm, prompts, new_tokens) for name, prompts in workloads.items()}
    runner = llm.engine.executor.worker.runner
    return {"startup_s": startup, "rows": rows,
            "cudagraph_full_sizes": list(runner.dispatcher.full_sizes),
            "cudagraph_piecewise_max": max(runner.dispatcher.piecewise_sizes, default=0)}


def peaked_checkpoint(shape: str, root: str | None) -> str:
    """A random checkpoint of `shape` (made under root/<shape>-peaked on first use) whose next
    token is a fixed permutation of the last one by a wide margin: the residual branches'
    output projections scaled by 1e-4 leave the final hidden state about the input
    embedding, and lm_head row perm[x] is embedding row x, so the winning logit is a
    self-product (~80) against random ones (< ~7). Every kernel still runs at full size."""
    import transformers

    out = Path(root) / f"{shape}-peaked" if root else Path(tempfile.mkdtemp(prefix="peaked-"))
    if (out / "config.json").exists():
        return str(out)
    kw = dict(SHAPES[shape])
    cfg = getattr(transformers, kw.pop("arch"))(**kw)
    if cfg.tie_word_embeddings:
        raise ValueError(f"shape {shape} ties lm_head to the embedding: it cannot be peaked")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(_BRANCH_SCALE)
            layer.mlp.down_proj.weight.mul_(_BRANCH_SCALE)
        embed = model.get_input_embeddings().weight
        perm = peak_permutation(embed.shape[0])
        model.get_output_embeddings().weight.copy_(embed[perm.argsort().to(embed.device)])
    model.save_pretrained(out, safe_serialization=True)
    del model, embed
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # phases run in child processes and need the whole device
    return str(out)


def peak_permutation(vocab: int) -> torch.Tensor:
    """perm of the peaked checkpoint: its greedy token after x is perm[x]."""
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(1))


def quoting(prompt_len: int, vocab: int, filler: int = 32) -> list[list[int]]:
    """One prompt for the peaked checkpoint whose answer quotes it: a walk x, perm[x],
    perm[perm[x]] ..., random filler, then x again, after which the model's greedy answer
    is the walk once more (a quote of the prompt's first prompt_len - filler - 1 tokens)."""
    perm, token = peak_permutation(vocab).tolist(), 1
    walk = []
    for _ in range(prompt_len - filler - 1):
        walk.append(token)
        token = perm[token]
    return [walk + random_ids(1, filler, vocab, seed=3)[0] + walk[:1]]


def copy_heavy(prompt_len: int, vocab: int, span: int = 32) -> list[list[int]]:
    """One prompt that repeats a random span of `span` tokens up to prompt_len: the answer
    a copying model gives continues the period (random weights only sometimes do)."""
    piece = random_ids(1, span, vocab, seed=1)[0]
    return [(piece * (prompt_len // span + 1))[:prompt_len]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=list(SHAPES))
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--compile-mode", default="backend", choices=["backend", "stock", "none"])
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="the no-repetition batch")
    ap.add_argument("--disable-by-batch-size", type=int, default=32,
                    help="speculative_config.disable_by_batch_size of the n-gram engine")
    ap.add_argument("--kv-bytes", type=int, default=4 << 30, help="KV budget per engine")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS),
                    choices=list(CONFIGS + EXTRA_CONFIGS))
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    k = args.num_speculative_tokens
    model_dir = shape_checkpoint(args.shape, args.checkpoint_dir)
    vocab = SHAPES[args.shape]["vocab_size"]
    plain = random_ids(args.batch, args.prompt_len, vocab, seed=2)
    copy = copy_heavy(args.prompt_len, vocab)
    ngram = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
             "prompt_lookup_min": 2}
    configs = {
        "off": lambda: (None, {"copy_b1": copy, "plain_b1": plain[:1],
                               f"plain_b{args.batch}": plain}, model_dir),
        "ngram": lambda: ({**ngram, "disable_by_batch_size": args.disable_by_batch_size},
                          {"copy_b1": copy, f"plain_b{args.batch}": plain}, model_dir),
        "ngram_nolimit": lambda: (ngram, {f"plain_b{args.batch}": plain}, model_dir),
        "draft_self": lambda: _draft_self(args, plain),
        # the peaked checkpoint copies by construction: n-gram at the acceptance of a real
        # quoting answer, against spec off on the same checkpoint and prompt
        "off_peaked": lambda: (None, {"quote_b1": quoting(args.prompt_len, vocab)},
                               peaked_checkpoint(args.shape, args.checkpoint_dir)),
        "ngram_peaked": lambda: ({**ngram, "disable_by_batch_size": args.disable_by_batch_size},
                                 {"quote_b1": quoting(args.prompt_len, vocab)},
                                 peaked_checkpoint(args.shape, args.checkpoint_dir)),
        "draft_2layer": lambda: ({"method": "draft_model", "num_speculative_tokens": k,
                                  "model": _two_layer_draft(args)}, {"plain_b1": plain[:1]},
                                 model_dir),
    }
    payload = {"device": device_name(), "args": vars(args), "results": {}, "table": [],
               "notes": "random weights: n-gram acceptance comes from the model's own "
                        "repetition; draft_self runs on the peaked checkpoint (target and "
                        "draft), so it must accept every draft (tokens per verify step = "
                        "k+1)"}
    for name in args.configs:
        spec, workloads, target = configs[name]()  # (a phase makes its checkpoint first)
        payload["results"][name] = isolate.call(
            "benchmarks.spec_decode:run", model_dir=target, dtype=args.dtype,
            compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode, spec=spec,
            workloads=workloads, new_tokens=args.new_tokens, kv_bytes=args.kv_bytes)
        payload["table"] = _table(payload["results"])
        save_json(args.output_json, payload)  # after every phase
    print_table(payload["table"], f"speculative decoding, {args.shape}, k={k} "
                f"({device_name()})")
    if args.output_json:
        print(f"results: {args.output_json}")


def _draft_self(args, plain: list[list[int]]) -> tuple[dict, dict, str]:
    """The peaked checkpoint as target and draft, at batch 1 (the figure is tokens per
    target step against k+1; its speed-up compares with spec off on the plain checkpoint,
    of the same shapes)."""
    peaked = peaked_checkpoint(args.shape, args.checkpoint_dir)
    spec = {"method": "draft_model", "model": peaked,
            "num_speculative_tokens": args.num_speculative_tokens}
    return spec, {"plain_b1": plain[:1]}, peaked


def _two_layer_draft(args) -> str:
    draft_shape = f"{args.shape}-2l"
    SHAPES[draft_shape] = {**SHAPES[args.shape], "num_hidden_layers": 2}
    return shape_checkpoint(draft_shape, args.checkpoint_dir)


def _table(results: dict) -> list[dict]:
    """One row per (config, workload), with speed-up against spec off on the same workload."""
    rows = []
    off = {**results.get("off", {}).get("rows", {}),
           **results.get("off_peaked", {}).get("rows", {})}
    for name, res in results.items():
        if "error" in res:
            rows.append({"config": name, "workload": "-", "decode tok/s": 0.0, "speedup": 0.0,
                         "tok/target step": 0.0, "acceptance": res["error"][:60]})
            continue
        for workload, row in res["rows"].items():
            base = off.get(workload, {}).get("decode_tok_s")
            rows.append({"config": name, "workload": workload,
                         "decode tok/s": row["decode_tok_s"],
                         "speedup": row["decode_tok_s"] / base if base else float("nan"),
                         "tok/target step": row["tokens_per_target_step"],
                         "acceptance": f"{row.get('acceptance_rate', float('nan')):.3f}"})
    return rows


if __name__ == "__main__":
    main()
