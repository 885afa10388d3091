"""Shared benchmark helpers: random-weight checkpoints of named shapes, tables, JSON results,
PNG plots."""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    # name: (LlamaConfig/Qwen3Config kwargs)
    "cpu-small": dict(arch="LlamaConfig", vocab_size=4096, hidden_size=256, intermediate_size=688,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=2048),
    "qwen3-0.6b": dict(arch="Qwen3Config", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       tie_word_embeddings=True, rope_theta=1000000.0),
    # gpt-fast's "stories15M" config (a Llama of 15M parameters): the gpt-fast peer's CPU runs
    "stories15m": dict(arch="LlamaConfig", vocab_size=32000, hidden_size=288,
                       intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
                       num_key_value_heads=6, max_position_embeddings=2048, rms_norm_eps=1e-5,
                       rope_theta=10000.0),
    # max_position_embeddings as Llama 3.1's, so that 16k-token prompts fit (prefill benchmark)
    "llama3-8b": dict(arch="LlamaConfig", vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0),
    # mixture of experts: Qwen3-30B-A3B (61 GB in bf16), and its widths at 8 layers (11 GB)
    "qwen3-30b-a3b": dict(arch="Qwen3MoeConfig", vocab_size=151936, hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          max_position_embeddings=40960, rope_theta=1000000.0),
    # a tiny Qwen3-MoE for CPU smoke runs; widths of 128 so that block FP8 applies
    "cpu-moe": dict(arch="Qwen3MoeConfig", vocab_size=512, hidden_size=128, intermediate_size=256,
                    moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=2048),
    "qwen3-30b-a3b-8l": dict(arch="Qwen3MoeConfig", vocab_size=151936, hidden_size=2048,
                             intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                             num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=8,
                             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                             max_position_embeddings=40960, rope_theta=1000000.0),
}


def random_checkpoint(shape: str, dtype: torch.dtype = torch.bfloat16, out: str | None = None):
    """Save a random-weight checkpoint of a named shape (weights and config; no tokenizer)."""
    import transformers

    kw = dict(SHAPES[shape])
    cfg = getattr(transformers, kw.pop("arch"))(**kw)
    out_dir = Path(out or tempfile.mkdtemp(prefix=f"bench-{shape}-"))
    if (out_dir / "config.json").exists():
        return out_dir
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    # 5 GB shards: a checkpoint converted shard by shard never holds two copies on disk
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="5GB")
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # phases run in child processes and need the whole device
    return out_dir


def shape_checkpoint(shape: str, root: str | None, dtype: torch.dtype = torch.bfloat16,
                     tokenizer: bool = False) -> str:
    """The checkpoint of `shape` under `root/shape`, made there on first use (else a temp dir);
    with `tokenizer`, also a made-up tokenizer of the shape's vocabulary (see shape_tokenizer)."""
    out = random_checkpoint(shape, dtype, out=str(Path(root) / shape) if root else None)
    if tokenizer and not (out / "tokenizer.json").exists():
        shape_tokenizer(SHAPES[shape]["vocab_size"]).save_pretrained(out)
    return str(out)


def shape_tokenizer(vocab_size: int, max_token_chars: int = 12):
    """A byte-level BPE tokenizer of exactly vocab_size ids, <|endoftext|> the last, whose
    merges are made up (random weights need no trained vocabulary): it lets a random-weight
    checkpoint take the user's path, detokenizing every token as a real tokenizer would."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens, merges, rng = list(alphabet), [], random.Random(0)
    vocab = {t: i for i, t in enumerate(tokens)}
    while len(tokens) < vocab_size - 1:
        left, right = tokens[rng.randrange(len(tokens))], rng.choice(alphabet)
        if len(left) < max_token_chars and left + right not in vocab:
            vocab[left + right] = len(tokens)
            tokens.append(left + right)
            merges.append((left, right))
    vocab["<|endoftext|>"] = len(tokens)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


def default_dtype() -> str:
    return "bfloat16" if torch.cuda.is_available() else "float32"


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_ids(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`batch` prompts of `length` random token ids in [1, vocab)."""
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(batch)]


def add_common_args(ap: argparse.ArgumentParser, shapes: list[str]) -> None:
    """Options every issue-4 benchmark takes."""
    ap.add_argument("--shape", nargs="+", default=shapes, choices=list(SHAPES))
    ap.add_argument("--checkpoint-dir", default=None,
                    help="reuse or create the random checkpoints here, one folder per shape")
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--compile-mode", default="backend", choices=["backend", "stock", "none"],
                    help="compiled-llm's compile mode; none = eager (and an eager peer)")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--scheduling", nargs="+", default=["sync", "async"],
                    choices=["sync", "async"],
                    help="run compiled-llm step by step, with async scheduling, or both")
    ap.add_argument("--json", default=None, help="default: bench_out/<name>_<device>.json")
    ap.add_argument("--plot", default=None, help="default: the JSON path with .png")


def finish(name: str, args: argparse.Namespace, payload: dict, draw) -> None:
    """Save the JSON result (with device and arguments) and the plot (draw None: no plot)."""
    json_path, plot_path = output_paths(name, args.json, args.plot)
    save_json(json_path, {"device": device_name(), "torch": torch.__version__,
                          "args": vars(args), **payload})
    print(f"results: {json_path}")
    if draw is not None:
        save_plot(plot_path, draw)


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - t


def print_table(rows: list[dict], title: str) -> None:
    cols = list(rows[0])
    widths = [max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols]
    print(f"\n## {title}\n")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(_fmt(r[c]).ljust(w) for c, w in zip(cols, widths)) + " |")


def _fmt(v) -> str:
    if isinstance(v, float):  # two decimals below 10 (ratios, milliseconds), else one
        return f"{v:.2f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def save_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2))


def output_paths(name: str, json_path: str | None, plot_path: str | None) -> tuple[str, str]:
    """JSON and PNG paths: given ones, else bench_out/<name>_<device>.{json,png}."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    json_path = json_path or f"bench_out/{name}_{dev}.json"
    return json_path, plot_path or str(Path(json_path).with_suffix(".png"))


def per_shape_plot(rows: list[dict], panel, width: float = 6):
    """A draw function for save_plot: one panel per shape, panel(ax, shape, that shape's rows)."""
    def _draw(plt):
        shapes = list(dict.fromkeys(r["shape"] for r in rows))
        fig, axes = plt.subplots(1, len(shapes), figsize=(width * len(shapes), 4), squeeze=False)
        for ax, shape in zip(axes[0], shapes):
            panel(ax, shape, [r for r in rows if r["shape"] == shape])
        return fig
    return _draw


def save_plot(path: str, draw) -> None:
    """draw(plt) makes a figure; saved to path. Skipped with a message without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed (pip install '.[bench]'): no plot at {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw(plt)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")


def decode_engine_args(shape: str, args: argparse.Namespace) -> dict:
    """benchmarks.ours:decode's arguments for a paired decode benchmark (async scheduling)."""
    return dict(model_dir=shape_checkpoint(shape, args.checkpoint_dir), dtype=args.dtype,
                compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                new_tokens=args.new_tokens, async_scheduling=True)


def decode_pair_main(name: str, doc: str, title: str, shapes: list[str], run_shape,
                     batch_sizes: list[int], prompt_len: int, new_tokens: int) -> None:
    """The command line of a paired decode benchmark: rows from run_shape(shape, args) per
    shape, printed as one table and saved as JSON under `name`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_common_args(ap, shapes)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=batch_sizes)
    ap.add_argument("--prompt-len", type=int, default=prompt_len)
    ap.add_argument("--new-tokens", type=int, default=new_tokens)
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs per variant, the order reversed every other round; best kept")
    args = ap.parse_args()
    rows = []
    for shape in args.shape:
        rows += run_shape(shape, args)
        save_json(output_paths(name, args.json, args.plot)[0],  # after every shape
                  {"device": device_name(), "args": vars(args), "rows": rows, "partial": True})
    print_table(rows, f"{title}: decode, {args.prompt_len}-token prompts, {args.new_tokens} "
                f"timed tokens, {args.dtype}, graphs {args.cudagraph_mode}, async")
    finish(name, args, {"rows": rows}, None)


def fused_pair_rows(shape: str, args: argparse.Namespace, off_passes: dict,
                    on_passes: dict | None = None) -> list[dict]:
    """One row per batch size of a fusion's decode benchmark: tok/s with the default passes
    plus on_passes ("fused") and with off_passes ("unfused"), and their ratio."""
    fused = {"passes": on_passes} if on_passes else {}
    _, tok_s = decode_runs(shape, args, {"fused": fused, "unfused": {"passes": off_passes}})
    rows = []
    for batch in args.batch_sizes:
        fused, unfused = (tok_s[k].get(batch, math.nan) for k in ("fused", "unfused"))
        rows.append({"shape": shape, "batch": batch, "fused tok/s": fused,
                     "unfused tok/s": unfused, "fused / unfused": fused / unfused,
                     "fused step ms": 1e3 * batch / fused})
    return rows


def decode_runs(shape: str, args: argparse.Namespace, variants: dict[str, dict]):
    """Run benchmarks.ours:decode once per variant (its extra arguments) and round
    (`args.rounds`, default 1; odd rounds run the variants in reverse order, so neither is
    always the first process), each in its own process: (last results by variant, {variant:
    {batch: best tok/s}}); failures are printed."""
    from benchmarks import isolate

    common = decode_engine_args(shape, args)
    runs, tok_s = {}, {name: {} for name in variants}
    for round_index in range(getattr(args, "rounds", 1)):
        names = list(variants)[::-1] if round_index % 2 else list(variants)
        for name in names:
            res = runs[name] = isolate.call("benchmarks.ours:decode", **common, **variants[name])
            if "error" in res:
                print(f"{shape} {name}: {res['error']}")
            for row in res.get("rows", []):
                best = tok_s[name].get(row["batch"], 0.0)
                tok_s[name][row["batch"]] = max(best, row["tok_s"])
    return runs, tok_s


def graph_ms(call, copies: int, iters: int = 24) -> float:
    """Mean ms of call(i) over iters calls (i cycling the copies) replayed in one CUDA graph."""
    for i in range(copies):
        call(i)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            call(i % copies)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (3 * iters)
