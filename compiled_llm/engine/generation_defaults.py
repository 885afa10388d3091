"""Default sampling parameters from the model's generation_config.json, as vLLM's
`--generation-config auto` takes them: what a request leaves unset follows the model
creator's temperature, top_k, top_p, min_p, repetition_penalty and max_new_tokens."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.loader import read_json

logger = logging.getLogger(__name__)
FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def generation_defaults(model_dir: str, source: str = "auto",
                        overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """SamplingParams fields (max_new_tokens as max_tokens) from source: "auto" (model_dir's
    generation_config.json), "vllm" (none) or a directory holding one; overrides win.
    ValueError naming generation_config or override_generation_config on a bad value."""
    unknown = sorted(set(overrides or {}) - set(FIELDS))
    if unknown:
        raise ValueError(f"override_generation_config: unknown keys {unknown}; allowed: "
                         f"{', '.join(FIELDS)}")
    config = {**_read(model_dir, source), **(overrides or {})}
    fields = {name: config[name] for name in FIELDS if config.get(name) is not None}
    if "max_new_tokens" in fields:  # transformers' name for max_tokens
        fields["max_tokens"] = fields.pop("max_new_tokens")
    try:
        SamplingParams(**fields)
    except (TypeError, ValueError) as err:
        raise ValueError(f"generation_config: its defaults are not valid sampling "
                         f"parameters ({err})") from err
    if fields:
        logger.warning("default sampling parameters come from the model's generation config: "
                       "%s (generation_config='vllm' keeps SamplingParams' own)", fields)
    return fields


def max_tokens_cap(source: str, overrides: dict[str, Any] | None,
                   defaults: dict[str, Any]) -> int | None:
    """The output budget no request may pass, as vLLM's server keeps one: max_new_tokens of
    a generation config given by path or of the overrides (auto's only fills in a default)."""
    if source not in ("auto", "vllm"):
        return defaults.get("max_tokens")
    return (overrides or {}).get("max_new_tokens")


def _read(model_dir: str, source: str) -> dict[str, Any]:
    if source == "vllm":
        return {}
    if source == "auto":
        return read_json(Path(model_dir) / "generation_config.json")
    path = Path(source) / "generation_config.json"
    if not path.is_file():
        raise ValueError(f"generation_config must be auto, vllm or a directory holding a "
                         f"generation_config.json; {source!r} holds none")
    return read_json(path)
