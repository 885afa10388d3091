"""The user's path on the CPU (the CI machine): `LLM()` on the demo model with default settings,
48 requests with prompts and outputs uniform in [20, 200] tokens, temperature 0.6, ignore_eos;
the best of three generate calls, in output tokens/s. Imports only the public API, so the same
file times any tree put on PYTHONPATH first.

    python benchmarks/cpu_user_path.py after
    PYTHONPATH=.before/tree python benchmarks/cpu_user_path.py before
    python benchmarks/cpu_user_path.py after-sync '{"async_scheduling": false}'
"""

from __future__ import annotations

import json
import random
import sys
import time


def main() -> None:
    """Print one JSON row: the label and the best output tokens/s of three runs."""
    from compiled_llm import LLM, SamplingParams

    label = sys.argv[1] if len(sys.argv) > 1 else "default"
    llm = LLM(**(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)
    reqs = [([rng.randrange(vocab) for _ in range(rng.randint(20, 200))], rng.randint(20, 200))
            for _ in range(48)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for _, n in reqs]
    llm.generate([{"prompt_token_ids": [1] * 16}], SamplingParams(max_tokens=4), use_tqdm=False)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in reqs], params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        best = max(best, tokens / (time.perf_counter() - start))
    print(json.dumps({"label": label, "out_tok_s": round(best, 1)}))
    llm.shutdown()


if __name__ == "__main__":
    main()
