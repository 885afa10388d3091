"""What an engine core is built from besides EngineArgs (the worker spec and the EOS ids),
without transformers: a core process can derive it from args alone (`serve` with several API
servers sends it only args, before the front end has imported anything heavy)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from compiled_llm.config import EngineArgs, model_len_bounds
from compiled_llm.worker.loader import load_hf_config, read_json, resolve_dtype
from compiled_llm.worker.spec import WorkerSpec

logger = logging.getLogger(__name__)
DEMO_MODEL = Path(__file__).parents[1] / "data" / "demo_model"
EARLY_LOAD_OFF = ("0", "false", "off", "no")  # $COMPILED_LLM_EARLY_LOAD values that turn it off


def resolve_device(device: str) -> torch.device:
    """The torch device for EngineArgs.device (auto: CUDA when present, else CPU)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def eos_ids(model_dir: str, hf: dict[str, Any], tokenizer) -> tuple[int, ...]:
    """EOS ids from generation_config.json (else config.json) and the tokenizer's, as vLLM
    stops on both: a chat model's config often names <|endoftext|> where its tokenizer (and
    so its chat turns) end in <|im_end|> or <|eot_id|>."""
    gen = read_json(Path(model_dir) / "generation_config.json")
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return with_tokenizer_eos(ids, tokenizer)


def with_tokenizer_eos(ids: tuple[int, ...], tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS id (where it has one) first, then ids' others. The first is the
    primary EOS: it finishes a request with stop_reason None, the others (vLLM adds them to
    stop_token_ids) with their id as stop_reason."""
    primary = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if primary is None:
        return ids
    return (int(primary), *(token for token in ids if token != primary))


def core_spec(args: EngineArgs, tokenizer) -> tuple[WorkerSpec, tuple[int, ...]]:
    """What an engine core is built from besides args: the worker spec (model directory,
    dtype, device, scheduler config) and the EOS token ids."""
    model_dir = str(args.model or DEMO_MODEL)
    device = resolve_device(args.device)
    hf = load_hf_config(model_dir)
    # max_model_len is an upper bound here: the worker settles it from the KV cache's size
    sched_cfg = args.scheduler_config(*model_len_bounds(hf))
    spec = WorkerSpec(model_dir, resolve_dtype(args.dtype, hf, device), device, sched_cfg)
    return spec, eos_ids(model_dir, hf, tokenizer)


def core_spec_from_args(args: EngineArgs) -> tuple[WorkerSpec, tuple[int, ...]]:
    """core_spec with the tokenizer loaded only when the configs give no EOS id (as a front
    end that has not loaded its tokenizer yet does)."""
    spec, eos = core_spec(args, None)
    if not eos and not args.skip_tokenizer_init:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or spec.model_dir)
        spec, eos = core_spec(args, tokenizer)
    return spec, eos


def load_weights_early(args: EngineArgs, spec: WorkerSpec | None = None) -> None:
    """The worker's model loaded now, for the worker built next in this process to take
    (worker/early_load), unless $COMPILED_LLM_EARLY_LOAD turns it off; first the warm compile
    children a cold start would take (their imports beside the read). A spec of None is
    derived from args without the tokenizer; where that fails, the engine's start says why."""
    try:
        spec = spec or core_spec(args, None)[0]
    except Exception:  # noqa: BLE001 (building the engine raises it again, and reports it)
        return
    from compiled_llm.worker import early_load
    from compiled_llm.worker.compile_children import start_early_children

    try:  # best effort: without them the worker starts its own, or compiles in-process
        start_early_children(spec.device, args)
    except Exception:  # noqa: BLE001
        logger.info("warm compile children not started ahead", exc_info=True)
    if os.environ.get("COMPILED_LLM_EARLY_LOAD", "1").strip().lower() not in EARLY_LOAD_OFF:
        early_load.load_early(args, spec)
