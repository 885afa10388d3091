"""Kernels per RMSNorm site in Inductor's generated code, and decode/prefill speed, for a 2-layer
Llama of Llama-3-8B's widths (hidden 4096, bf16): with T's size hint (what compat.py marks) and
without it (T unbacked and unhinted, where Inductor scores every [T, D] buffer as 0 bytes shared
and so never fuses a norm's reduction with its residual add or its epilogue). Each row runs in a
fresh process with empty compile caches, so every graph goes through Inductor's scheduler.

    python -m benchmarks.norm_kernels                       # on a CUDA machine
    python -m benchmarks.norm_kernels --modes backend --cudagraph-mode full_and_piecewise
    python -m benchmarks.norm_kernels --shape cpu-small --prefill 64    # CPU (C++ kernels)

"kernels/site" is 1 + the kernels that feed a norm's reduction or read its result from another
kernel (scheduler view, max over sites); "triton red / rsqrt" count the generated Triton kernels
that reduce and those that hold the norm's rsqrt: fused, each norm site is one reduction kernel
that holds its rsqrt.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time

from benchmarks import isolate
from benchmarks.common import SHAPES, print_table, save_json

LAYERS = 2


def checkpoint(out: str, shape: str) -> str:
    """A random-weight 2-layer model of the shape's widths (bf16), saved under out."""
    import torch
    import transformers

    kw = {**SHAPES[shape], "num_hidden_layers": LAYERS}
    cfg = getattr(transformers, kw.pop("arch"))(**kw)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


def measure(model: str, mode: str, hinted: bool, cudagraph_mode: str, prefill: int) -> dict:
    """One row, in this (fresh) process: compile with hooks on Inductor, then time."""
    import torch

    import compiled_llm.compile as compile_pkg
    from compiled_llm import LLM, SamplingParams
    from compiled_llm.compat import capture_inductor_code
    from tests.passes.helpers import reduction_sites, scheduled_nodes

    # a fresh Inductor cache: a hit would skip the scheduler (and the backend's cache needs one)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="norm-kernels-inductor-")
    if not hinted:
        compile_pkg.mark_tokens_dynamic = _mark_unhinted
    with tempfile.TemporaryDirectory() as cache, capture_inductor_code() as codes, \
            scheduled_nodes() as graphs:
        llm = LLM(model, dtype="bfloat16", compile_mode=mode, cudagraph_mode=cudagraph_mode,
                  compile_cache_dir=cache, skip_tokenizer_init=True, seed=0,
                  enable_prefix_caching=False, max_model_len=max(2048, 2 * prefill))
        speed = _speed(llm, SamplingParams, torch, prefill)
    sites = reduction_sites(graphs)
    kernels = _triton_kernels("\n".join(codes))
    return {"mode": mode, "T hint": "yes" if hinted else "no", "graphs": len(graphs),
            "norm sites": len(sites), "kernels/site": 1 + max(sum(s) for s in sites),
            "triton red": sum(k.startswith(("triton_red", "triton_per")) for k in kernels),
            "triton rsqrt": sum("rsqrt" in src for src in kernels.values()), **speed,
            "kernels": sorted(kernels)}


def _mark_unhinted(*tensors) -> None:
    import torch

    for t in tensors:
        torch._dynamo.decorators.mark_unbacked(t, 0)


def _triton_kernels(code: str) -> dict[str, str]:
    """Unique generated Triton kernels: name -> source."""
    quotes = "'" * 3
    pattern = rf"^(triton_\w+) = async_compile\.triton\(.*?r?{quotes}(.*?){quotes}"
    return dict(re.findall(pattern, code, flags=re.M | re.S))


def _speed(llm, SamplingParams, torch, prefill: int) -> dict:
    """Decode ms/token at batch 1 (128-token prompt) and prefill ms for one prompt."""
    vocab = llm.engine.model_config.vocab_size
    short = {"prompt_token_ids": list(range(1000, 1128))}
    long = {"prompt_token_ids": [(i * 7) % (vocab - 10) + 10 for i in range(prefill)]}

    def gen(n: int, prompt) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    gen(8, short), gen(1, long)  # warm-up (compiles, autotunes)
    decode = (min(gen(257, short) for _ in range(2)) - min(gen(1, short) for _ in range(2))) / 256
    return {"decode ms/tok": 1e3 * decode,
            f"prefill {prefill} ms": 1e3 * min(gen(1, long) for _ in range(3))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", default=["backend", "stock"])
    ap.add_argument("--cudagraph-mode", default="none")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--shape", default="llama3-8b", choices=list(SHAPES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = isolate.call("benchmarks.norm_kernels:checkpoint_path", out=tmp,
                             shape=args.shape)["path"]
        rows = [isolate.call("benchmarks.norm_kernels:measure", model=model, mode=mode,
                             hinted=hinted, cudagraph_mode=args.cudagraph_mode,
                             prefill=args.prefill)
                for mode in args.modes for hinted in (True, False)]
    ok = [r for r in rows if "error" not in r]
    for r in rows:
        if "error" in r:
            print("failed:", r["error"])
    for r in ok:
        print(f"{r['mode']}, T hint {r['T hint']}: {', '.join(r['kernels'])}")
    table = [{k: v for k, v in r.items() if k != "kernels"} for r in ok]
    for r in table:
        peer = next((p for p in table if p["mode"] == r["mode"] and p["T hint"] == "no"), None)
        for key in ("decode ms/tok", f"prefill {args.prefill} ms"):
            r[f"{key.split()[0]} vs no hint"] = r[key] / peer[key] if peer else float("nan")
    if table:
        print_table(table, f"Kernels per norm site, {LAYERS}-layer {args.shape} widths")
    save_json(args.json, {"rows": ok})


def checkpoint_path(out: str, shape: str) -> dict:
    return {"path": checkpoint(out, shape)}


if __name__ == "__main__":
    main()
