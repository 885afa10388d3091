"""Shared benchmark helpers: random-weight checkpoints of named shapes, tables, JSON results."""

from __future__ import annotations

import json
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
    "llama3-8b": dict(arch="LlamaConfig", vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0),
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
    model.save_pretrained(out_dir, safe_serialization=True)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # phases run in child processes and need the whole device
    return out_dir


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
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


def save_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2))
