"""gpt-fast as the batch-1 decode peer: one of our random-weight HF Llama checkpoints converted to
gpt-fast's model.pth (with a made-up tiktoken tokenizer), then gpt-fast's own generate.py (static
KV cache, torch.compile reduce-overhead + fullgraph) in a subprocess, its printed figures parsed.
gpt-fast's tree lives in .peer/gpt-fast (git-ignored, never committed; see PEER_DIR)."""

from __future__ import annotations

import base64
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# exported from gpt-fast's repository with
#   git --git-dir=MIRROR archive HEAD | tar -x -C .peer/gpt-fast
#   git --git-dir=MIRROR rev-parse HEAD > .peer/gpt-fast.commit
PEER_DIR = Path(os.environ.get("GPTFAST_DIR", ROOT / ".peer" / "gpt-fast"))
# gpt-fast picks its tiktoken tokenizer when the checkpoint path names "llama-3" (tokenizer.py,
# get_tokenizer) and its model config by the checkpoint folder's name (model.py, from_name)
CONVERTED = "gptfast-llama-3-tiktoken"


def load_peer_module(name: str):
    """gpt-fast's top-level module `name` (model, tokenizer), imported from PEER_DIR by path so
    that its plain names (model, tokenizer) never shadow anything on sys.path."""
    path = PEER_DIR / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"gpt-fast is not at {PEER_DIR} (no {path.name}): export its "
                                "repository there or set GPTFAST_DIR")
    spec = importlib.util.spec_from_file_location(f"gptfast_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rope_theta(hf_config: dict) -> float:
    """RoPE base of a transformers config (v5 rope_parameters or the older top-level key);
    ValueError for any scaled RoPE: the shapes benchmarked use plain RoPE."""
    rope = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope_parameters: gpt-fast peer converts plain RoPE only, got {rope}")
    return float(rope.get("rope_theta", hf_config.get("rope_theta", 10000.0)))


def _shape(hf_config: dict) -> tuple:
    """The fields of a transformers Llama config that decide gpt-fast's ModelArgs, in its order
    (vocab_size, n_layer, n_head, n_local_heads, dim, intermediate_size, rope_base)."""
    if hf_config.get("model_type") != "llama":
        raise ValueError(f"model_type={hf_config.get('model_type')!r}: gpt-fast's model is Llama "
                         "only (no QK-norm, head_dim = dim / n_head), so the peer takes Llama "
                         "checkpoints only")
    if hf_config.get("attention_bias") or hf_config.get("mlp_bias"):
        raise ValueError("attention_bias/mlp_bias: gpt-fast's linears have no bias")
    heads, dim = hf_config["num_attention_heads"], hf_config["hidden_size"]
    if hf_config.get("head_dim", dim // heads) != dim // heads:
        raise ValueError(f"head_dim={hf_config['head_dim']}: gpt-fast needs hidden_size / heads")
    return (hf_config["vocab_size"], hf_config["num_hidden_layers"], heads,
            hf_config.get("num_key_value_heads", heads), dim, hf_config["intermediate_size"],
            _rope_theta(hf_config))


def gptfast_name(hf_config: dict) -> str:
    """The name of gpt-fast's transformer_configs entry whose shape is the checkpoint's (exact:
    layers, heads, KV heads, widths, vocabulary, RoPE base, no RoPE scaling). rms_norm_eps is
    not compared: gpt-fast fixes 1e-5, which changes the numbers but not the speed."""
    model = load_peer_module("model")
    want = _shape(hf_config)
    for name, kwargs in model.transformer_configs.items():
        args = model.ModelArgs(**kwargs)
        have = (args.vocab_size, args.n_layer, args.n_head, args.n_local_heads, args.dim,
                args.intermediate_size, float(args.rope_base))
        if have == want and args.rope_scaling is None:
            return name
    raise ValueError(f"no gpt-fast config has this shape {want} (vocab, layers, heads, KV heads, "
                     "hidden, intermediate, rope base): gpt-fast picks configs by name only")


def convert_state_dict(hf_tensors: dict, args) -> dict:
    """transformers Llama weights as gpt-fast's Transformer state dict (args: its ModelArgs):
    q and k rows permuted from rotate-half to gpt-fast's interleaved RoPE pairs, q/k/v
    concatenated into wqkv, a tied lm_head taken from the embedding."""
    def permute(weight, heads):
        return (weight.view(heads, 2, args.head_dim // 2, args.dim).transpose(1, 2)
                .reshape(args.head_dim * heads, args.dim))

    out = {"tok_embeddings.weight": hf_tensors["model.embed_tokens.weight"],
           "norm.weight": hf_tensors["model.norm.weight"],
           "output.weight": hf_tensors.get("lm_head.weight",
                                           hf_tensors["model.embed_tokens.weight"])}
    for i in range(args.n_layer):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        out[ours + "attention.wqkv.weight"] = torch.cat([
            permute(hf_tensors[attn + "q_proj.weight"], args.n_head),
            permute(hf_tensors[attn + "k_proj.weight"], args.n_local_heads),
            hf_tensors[attn + "v_proj.weight"]])
        out[ours + "attention.wo.weight"] = hf_tensors[attn + "o_proj.weight"]
        for theirs, mine in (("gate_proj", "w1"), ("down_proj", "w2"), ("up_proj", "w3")):
            out[ours + f"feed_forward.{mine}.weight"] = hf_tensors[hf + f"mlp.{theirs}.weight"]
        out[ours + "attention_norm.weight"] = hf_tensors[hf + "input_layernorm.weight"]
        out[ours + "ffn_norm.weight"] = hf_tensors[hf + "post_attention_layernorm.weight"]
    return out


def _read_safetensors(model_dir: Path) -> dict:
    """Every tensor of a (possibly sharded) safetensors checkpoint, on the CPU."""
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    tensors = {}
    for name in files:
        tensors.update(load_file(str(model_dir / name), device="cpu"))
    return tensors


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A tiktoken BPE file of made-up byte tokens (every byte, then byte pairs, then triples) so
    many that with gpt-fast's reserved special tokens every id of the vocabulary decodes."""
    specials = load_peer_module("tokenizer").TiktokenWrapper.num_reserved_special_tokens
    if vocab_size <= 256 + specials:
        raise ValueError(f"vocab_size={vocab_size}: gpt-fast's tokenizer needs > {256 + specials}")
    pieces = itertools.chain.from_iterable(
        itertools.product(range(256), repeat=n) for n in (1, 2, 3))
    lines = (f"{base64.b64encode(bytes(p)).decode()} {rank}"
             for rank, p in enumerate(itertools.islice(pieces, vocab_size - specials)))
    path.write_text("\n".join(lines) + "\n")


def convert(model_dir: str) -> Path:
    """model.pth and tokenizer.model of gpt-fast for an HF Llama checkpoint, under
    model_dir/CONVERTED/<gpt-fast config name>/; made once, reused while newer than the
    checkpoint's config.json."""
    src = Path(model_dir)
    hf_config = json.loads((src / "config.json").read_text())
    name = gptfast_name(hf_config)
    out = src / CONVERTED / name
    pth = out / "model.pth"
    if any(q in str(pth) for q in ("int8", "int4")):  # generate.py would quantize
        raise ValueError(f"{pth}: gpt-fast reads int8/int4 in a path as quantized weights")
    if pth.is_file() and pth.stat().st_mtime >= (src / "config.json").stat().st_mtime:
        return pth
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out / "tokenizer.model", hf_config["vocab_size"])
    args = load_peer_module("model").ModelArgs.from_name(name)
    with torch.inference_mode():
        state = convert_state_dict(_read_safetensors(src), args)
        torch.save(state, out / "model.pth.tmp")
    os.replace(out / "model.pth.tmp", pth)  # a run cut short leaves no half-written model.pth
    return pth


# ---------------------------------------------------------------- generate.py
_FIGURES = {  # generate.py's printed lines -> result keys (per sample: lists)
    "compile_s": r"^Compilation time: ([\d.]+) seconds",
    "load_s": r"^Time to load model: ([\d.]+) seconds",
    "samples_tok_s": r"^Time for inference \d+: [\d.]+ sec total, ([\d.]+) tokens/sec",
    "bandwidth_gbs": r"^Bandwidth achieved: ([\d.]+) GB/s",
    "average_tok_s": r"^Average tokens/sec: ([\d.]+)",
    "prompt_len": r"^Prompt Length: (\d+)",
    "memory_gb": r"^Memory used: ([\d.]+) GB",
}
_PER_SAMPLE = ("samples_tok_s", "bandwidth_gbs")


def parse_generate(text: str) -> dict:
    """The figures generate.py printed: per-sample tokens/s and bandwidth as lists, the rest as
    numbers; ValueError when its closing average is missing (a run that did not finish)."""
    found: dict = {key: [] for key in _FIGURES}
    for line in text.splitlines():
        for key, pattern in _FIGURES.items():
            match = re.match(pattern, line)
            if match:
                found[key].append(float(match.group(1)))
    if not found["average_tok_s"] or not found["samples_tok_s"]:
        raise ValueError("gpt-fast's generate.py printed no 'Average tokens/sec' line")
    return {key: vals if key in _PER_SAMPLE else (vals[-1] if vals else None)
            for key, vals in found.items()}


def generate_command(pth: Path, batch: int, prompt_len: int, new_tokens: int,
                     num_samples: int, compiled: bool, device: str) -> list[str]:
    """generate.py with its own recipe: a synthetic prompt of prompt_len ids (`--prompt N`),
    its default sampling (temperature 0.8, top-k 200), and --compile (reduce-overhead,
    fullgraph decode step; prefill eager) unless compiled is False."""
    return [sys.executable, str(PEER_DIR / "generate.py"), "--checkpoint_path", str(pth),
            "--prompt", str(prompt_len), "--max_new_tokens", str(new_tokens),
            "--num_samples", str(num_samples), "--batch_size", str(batch), "--device", device,
            *(["--compile"] if compiled else [])]


def run_generate(cmd: list[str]) -> str:
    """Run generate.py; its output streams through (the sample texts of random tokens
    shortened, unprintable characters replaced) and comes back whole. RuntimeError with its
    last lines when it fails."""
    # an empty TIKTOKEN_CACHE_DIR: tiktoken would otherwise cache the tokenizer by path, and a
    # later checkpoint of another vocabulary at the same path would read the stale one
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": "", "PYTHONIOENCODING": "utf-8:replace"}
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=PEER_DIR, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        for line in proc.stdout:
            lines.append(line)
            shown = "".join(c if c.isprintable() else "?" for c in line.rstrip("\n"))
            print(f"gpt-fast| {shown[:200]}", flush=True)
    if proc.returncode != 0:
        tail = " | ".join(x.strip() for x in lines[-3:])
        raise RuntimeError(f"gpt-fast generate.py exited {proc.returncode}: {tail}")
    return "".join(lines)


def peer_commit() -> str | None:
    """The gpt-fast commit the tree was exported from, where .peer/gpt-fast.commit says it."""
    path = PEER_DIR.with_name(PEER_DIR.name + ".commit")
    return path.read_text().strip() if path.is_file() else None


def decode(model_dir: str, dtype: str, compile_mode: str, batch_sizes: list[int],
           prompt_len: int, new_tokens: int, num_samples: int = 5) -> dict:
    """gpt-fast's decode tokens/s at each batch size, one generate.py process each (after its
    own warm-up generation when compiled). tok_s is its "Average tokens/sec" times the batch:
    the time it divides by includes the eager prefill of the prompt. dtype must be bfloat16
    (generate.py fixes it); compile_mode "none" runs it eager, any other mode its recipe."""
    if dtype != "bfloat16":
        raise ValueError(f"dtype={dtype!r}: gpt-fast's generate.py runs bfloat16 only")
    t0 = time.perf_counter()
    pth = convert(model_dir)
    convert_s = time.perf_counter() - t0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for batch in batch_sizes:
        cmd = generate_command(pth, batch, prompt_len, new_tokens, num_samples,
                               compile_mode != "none", device)
        figures = parse_generate(run_generate(cmd))
        per_seq = figures["average_tok_s"]
        rows.append({"batch": batch, "tok_s": batch * per_seq, "ms_per_step": 1e3 / per_seq,
                     **figures, "command": cmd[1:]})
        print(f"gpt-fast decode: {rows[-1]['tok_s']:.1f} tok/s at batch {batch}", flush=True)
    return {"rows": rows, "config": pth.parent.name, "commit": peer_commit(),
            "convert_s": convert_s, "seconds": time.perf_counter() - t0}
