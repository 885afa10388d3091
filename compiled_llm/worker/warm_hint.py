"""Warm-start hints: whether a start with these arguments found (or stored) its compile
snapshot last time, known from the arguments alone, before the model exists. Warm compile
children are started ahead of the weights only where no hint says the start will be warm:
on a warm start they are pure cost (about 1 s of an 8B serve on the H200)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from compiled_llm.bytecode_cache import HINTS_DIRNAME, cache_root

logger = logging.getLogger(__name__)

# the arguments that change the model's compiled pieces (the compile cache's key, which needs
# the built model, is derived from them); serving-only fields (ports, batch limits, capture
# sizes) are left out, so that `compiled-llm compile` and `serve` of one model share a hint
KEY_FIELDS = ("model", "dtype", "device", "max_model_len", "kv_cache_dtype", "enforce_eager",
              "optimization_level", "compile_mode", "max_autotune", "passes", "load_format",
              "quantization", "attention_backend", "enable_lora", "max_loras", "max_lora_rank",
              "speculative_config", "runner", "pooler_config")


def hint_key(args) -> str:
    """A digest of args' KEY_FIELDS and the model directory's config.json."""
    from compiled_llm import __version__

    fields = {name: getattr(args, name, None) for name in KEY_FIELDS}
    config = Path(str(args.model or "")) / "config.json"
    blob = json.dumps({**fields, "version": __version__,
                       "config": config.read_bytes().hex() if config.is_file() else None},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _hint_path(args) -> Path:
    root = args.compile_config().cache_dir or cache_root()
    return Path(root) / HINTS_DIRNAME / hint_key(args)


def hinted_warm(args) -> bool:
    """Whether the last start with these arguments had its snapshot in the compile cache (a
    hint only: a cache cleared or rebuilt since makes it wrong, and a cold start then
    compiles without children started ahead)."""
    try:
        return _hint_path(args).is_file()
    except (OSError, ValueError):
        return False


def record(args, runner) -> None:
    """Leave the hint once the runner's backend has its snapshot in the compile cache (loaded
    on a warm start, stored by a cold one's first forward); best effort."""
    from compiled_llm.compile.backend import CompiledLLMBackend

    backend = getattr(runner.forward_fn, "backend", None)
    if not isinstance(backend, CompiledLLMBackend) or backend.opts.cache is None \
            or not backend.snapshot_name or not backend.opts.cache.has(backend.snapshot_name):
        return
    try:
        path = _hint_path(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        logger.debug("warm-start hint not written: %s", exc)
