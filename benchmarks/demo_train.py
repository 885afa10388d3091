"""Train the tiny demo LLM that ships inside the package (``compiled_llm/data/demo_model``).

This module owns the whole recipe for the bundled toy model: collecting freely licensed text
already present on the machine, training a byte-level BPE tokenizer, training a small
``LlamaForCausalLM`` from scratch for a wall-clock budget, and writing the model folder
(safetensors weights, config, generation config, tokenizer files and a README). The result is
for offline smoke tests and demos only; it is not a useful assistant.

Usage::

    python -m benchmarks.demo_train --out compiled_llm/data/demo_model [--minutes 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

DEFAULT_TEXT_DIR = Path("/usr/share/common-licenses")
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SEQ_LEN = 256
FLOAT32_LIMIT_BYTES = 4 * 1024 * 1024


def _iter_files(path: Path) -> list[Path]:
    """Regular (non-symlink) files under ``path``, or ``path`` itself, in sorted order."""
    if path.is_symlink() or not path.exists():
        return []
    candidates = [path] if path.is_file() else sorted(path.rglob("*"))
    return [p for p in candidates if p.is_file() and not p.is_symlink()]


def collect_corpus(paths: list[Path]) -> list[tuple[Path, str]]:
    """Read every UTF-8 text file under ``paths`` (binaries and duplicates skipped), in order."""
    seen: set[str] = set()
    docs: list[tuple[Path, str]] = []
    for f in (f for root in paths for f in _iter_files(root)):
        real = os.path.realpath(f)
        data = f.read_bytes()
        if real in seen or b"\x00" in data[:8192]:
            continue
        seen.add(real)
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            continue
        if text:
            docs.append((f, text + "\n"))
    return docs


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it with eos/pad and a ChatML template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def build_model(vocab_size: int, eos_id: int) -> LlamaForCausalLM:
    """The small GQA Llama used for the demo."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=384,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, progress: float, base_lr: float, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay over the wall-clock budget."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    return base_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train(
    model: LlamaForCausalLM, data: torch.Tensor, minutes: float, batch: int, lr: float, seed: int
) -> tuple[int, float]:
    """Train on random windows of ``data`` until the time budget runs out; return (steps, loss)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = minutes * 60.0
    start = time.monotonic()
    step, ema = 0, float("nan")
    model.train()
    while (elapsed := time.monotonic() - start) < budget:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, elapsed / budget, lr, warmup=100)
        idx = torch.randint(0, data.numel() - SEQ_LEN - 1, (batch,), generator=gen)
        x = torch.stack([data[i : i + SEQ_LEN + 1] for i in idx.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        ema = value if math.isnan(ema) else 0.95 * ema + 0.05 * value
        if step % 50 == 0:
            print(
                f"step {step:5d}  loss {value:.4f}  ema {ema:.4f}  "
                f"lr {opt.param_groups[0]['lr']:.2e}  {elapsed:6.0f}s",
                flush=True,
            )
        step += 1
    model.eval()
    return step, ema


def write_readme(
    out: Path,
    docs: list[tuple[Path, str]],
    vocab: int,
    n_tokens: int,
    steps: int,
    loss: float,
    n_params: int,
    dtype: torch.dtype,
) -> None:
    """Describe the model, its exact training command and its data sources."""
    command = "python -m benchmarks.demo_train " + shlex.join(sys.argv[1:])
    sources = "\n".join(f"- `{p}`" for p, _ in docs)
    text = f"""# compiled-llm demo model

A tiny Llama-architecture language model ({n_params:,} parameters, {str(dtype)[6:]} weights,
byte-level BPE vocabulary of {vocab:,}) bundled with `compiled-llm` so that
`compiled-llm generate "Some prompt"` works offline on a fresh machine.

**This is a toy for smoke tests and demos, not a useful assistant.** It has only seen a few
hundred kilobytes of software licence texts, so it writes licence-flavoured English and nothing
else. Its ChatML template (`<|im_start|>`/`<|im_end|>`) exists for plumbing tests only; it was
never trained on conversations. `<|endoftext|>` is eos, pad and the document separator.

## Training

    {command}

4 layers, hidden 128, 4 heads / 2 KV heads (GQA), head_dim 32, MLP 384, tied embeddings.
{n_tokens:,} training tokens, sequence length {SEQ_LEN}, AdamW with warmup and cosine decay,
fixed seed, one CPU thread: {steps:,} steps, final smoothed training loss {loss:.3f}.

## Data and licences

The licence texts shipped by the OS in `/usr/share/common-licenses` (Debian `base-files`):
Apache-2.0, Artistic, BSD, CC0-1.0, GFDL 1.2/1.3, GPL 1/2/3, LGPL 2/2.1/3, MPL 1.1/2.0. Their
authors (FSF, Apache Software Foundation, Mozilla, Creative Commons, ...) permit verbatim
redistribution; the model may reproduce fragments of them. Files used:

{sources}
"""
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", type=Path, action="append", default=[], help="extra text path")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    docs = collect_corpus([DEFAULT_TEXT_DIR, *args.text])
    if not docs:
        raise SystemExit("no training text found")
    texts = [t for _, t in docs]
    print(f"{len(docs)} documents, {sum(len(t) for t in texts):,} characters", flush=True)

    tokenizer = train_tokenizer(texts, args.vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer.backend_tokenizer.encode(t).ids)
        ids.append(eos_id)
    data = torch.tensor(ids, dtype=torch.long)
    print(f"vocab {len(tokenizer)}, {data.numel():,} tokens", flush=True)

    model = build_model(len(tokenizer), eos_id)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters", flush=True)
    steps, loss = train(model, data, args.minutes, args.batch_size, args.lr, args.seed)
    print(f"done: {steps} steps, final ema loss {loss:.4f}", flush=True)

    dtype = torch.float32 if n_params * 4 <= FLOAT32_LIMIT_BYTES else torch.bfloat16
    model = model.to(dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None).save_pretrained(
        args.out
    )
    tokenizer.save_pretrained(args.out)
    # Name the class every transformers version knows (v5 would write "TokenizersBackend").
    cfg_path = args.out / "tokenizer_config.json"
    tok_cfg = {**json.loads(cfg_path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}
    cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    write_readme(args.out, docs, len(tokenizer), data.numel(), steps, loss, n_params, dtype)
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
