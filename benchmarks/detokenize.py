"""Host cost of detokenization: N requests x T generated tokens on the tokenizer shipped with the
package (byte-level BPE, compiled_llm/data/demo_model), fed step by step as the engine does.

Rows: IncrementalDetokenizer one id per call; make_detokenizer's pick one id per call and a
group of ids per call (several tokens per step); the one-shot final decode (decode_output per
request, and decode_outputs for all at once). Every row's text is checked against the first.

    python -m benchmarks.detokenize [--requests 256] [--tokens 512] [--ids random|text]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from transformers import AutoTokenizer

from compiled_llm.engine.llm_engine import DEMO_MODEL
from compiled_llm.output.detokenizer import IncrementalDetokenizer
from compiled_llm.output.fast_detokenizer import make_detokenizer
from compiled_llm.output.final_decode import decode_output, decode_outputs

TEXT = (
    "The quick brown fox jumps over the lazy dog. Café naïve résumé, 東京は大きい 😀🎉. "
    "Hello world, hello there! Streaming text arrives one token at a time. "
)


def make_ids(tok, requests: int, tokens: int, kind: str, seed: int) -> list[list[int]]:
    """Per request, `tokens` ids: uniform over the vocabulary, or slices of encoded text."""
    rng = random.Random(seed)
    if kind == "random":
        return [[rng.randrange(len(tok)) for _ in range(tokens)] for _ in range(requests)]
    stream = tok.encode(TEXT * (2 * tokens // 20 + 2), add_special_tokens=False)
    starts = [rng.randrange(len(stream) - tokens) for _ in range(requests)]
    return [stream[start : start + tokens] for start in starts]


def stream_text(make: Callable, tok, prompts, outputs, group: int) -> list[str]:
    """Feed every request `group` ids per call, step-major as the engine does; final texts."""
    dets = [make(tok, prompt, True, True) for prompt in prompts]
    for pos in range(0, len(outputs[0]), group):
        for det, ids in zip(dets, outputs):
            det.add_tokens(ids[pos : pos + group])
    return [det.output_text for det in dets]


def timed(run: Callable[[], list[str]]) -> tuple[float, list[str]]:
    """Seconds of one run (best of three: the host may be shared) and its texts."""
    best, texts = float("inf"), []
    for _ in range(3):
        start = time.perf_counter()
        texts = run()
        best = min(best, time.perf_counter() - start)
    return best, texts


def main() -> None:
    """Time each path and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--ids", choices=["random", "text"], default="random")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    outputs = make_ids(tok, args.requests, args.tokens, args.ids, args.seed)
    prompts = [tok.encode("Tell me a story about", add_special_tokens=False)] * args.requests
    def streamed(make: Callable, group: int) -> Callable[[], list[str]]:
        return lambda: stream_text(make, tok, prompts, outputs, group)

    rows = [
        ("python, 1 id/call", streamed(IncrementalDetokenizer, 1)),
        ("python, 8 ids/call", streamed(IncrementalDetokenizer, 8)),
        ("fast, 1 id/call", streamed(make_detokenizer, 1)),
        ("fast, 4 ids/call", streamed(make_detokenizer, 4)),
        ("fast, 8 ids/call", streamed(make_detokenizer, 8)),
        ("one-shot, per request",
         lambda: [decode_output(tok, p, o) for p, o in zip(prompts, outputs)]),
        ("one-shot, batched", lambda: decode_outputs(tok, prompts, outputs)),
    ]
    total = args.requests * args.tokens
    print(f"{args.requests} requests x {args.tokens} tokens ({args.ids} ids), vocab {len(tok)}")
    print(f"{'path':<24}{'total ms':>10}{'us/token':>10}{'speed-up':>10}")
    base, reference = None, None
    for label, run in rows:
        seconds, texts = timed(run)
        base = base or seconds
        reference = reference or texts
        assert texts == reference, f"{label}: text differs from the Python algorithm"
        print(f"{label:<24}{1e3 * seconds:>10.1f}{1e6 * seconds / total:>10.3f}"
              f"{base / seconds:>9.1f}x")


if __name__ == "__main__":
    main()
