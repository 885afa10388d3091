"""`compiled-llm generate`: text for one or more prompts, streamed in prompt order."""

from __future__ import annotations

import argparse
import sys

from compiled_llm.entrypoints.cli.args import HelpFormatter, add_engine_args, engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `generate`: the engine flags, sampling flags, then the prompts."""
    parser = subparsers.add_parser("generate", formatter_class=HelpFormatter,
                                   help="generate text for one or more prompts, streamed")
    add_engine_args(parser)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="per-request sampling seed")
    parser.add_argument("--stop", action="append", default=None,
                        help="stop string (repeat for several)")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT")
    parser.set_defaults(func=run_generate)


def run_generate(ns: argparse.Namespace) -> int:
    """Stream each prompt's text; later prompts print once the ones before are done."""
    from compiled_llm.engine.llm_engine import LLMEngine
    from compiled_llm.output.detokenizer import held_back_chars
    from compiled_llm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature,
                            top_p=ns.top_p, top_k=ns.top_k, seed=ns.sample_seed, stop=ns.stop)
    engine = LLMEngine(engine_args(ns))
    for i, prompt in enumerate(ns.prompts):
        engine.add_request(str(i), prompt, params)
    # prompts print in order: the current one streams live, later ones wait their turn
    texts, done = [""] * len(ns.prompts), [False] * len(ns.prompts)
    shown, current = 0, 0
    sys.stdout.write(ns.prompts[0])
    while current < len(ns.prompts):
        for out in engine.step() if engine.has_unfinished_requests() else []:
            index = int(out.request_id)
            texts[index], done[index] = out.outputs[0].text, out.finished
        text = texts[current]
        safe = len(text) - (0 if done[current] else held_back_chars(text, ns.stop or []))
        sys.stdout.write(text[shown:safe])
        sys.stdout.flush()
        shown = max(shown, safe)
        if done[current]:
            current, shown = current + 1, 0
            sys.stdout.write("\n" + (ns.prompts[current] if current < len(ns.prompts) else ""))
    return 0
