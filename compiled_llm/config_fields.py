"""Reading the config dataclasses: each field's documentation (its attribute docstring, the
help of its flag), the values a Literal-typed field allows, the checks built on them, and
values spelled as vLLM spells them (human-readable integers, max_model_len's forms), an HF
config.json's rope parameters and length bounds as transformers and vLLM read them, and
hf_overrides' merged config.json (a directory linking the checkpoint's files beside it)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from compiled_llm.bytecode_cache import cache_root


@functools.cache
def config_docs(cls: type) -> dict[str, str]:
    """{field name: its attribute docstring} for a dataclass and its dataclass bases, read
    from their source with ast; a field with no string literal right under it is absent."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def split_optional(hint: object) -> tuple[object, bool]:
    """(hint without None, whether it allowed None): `int | None` gives (int, True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
    return hint, False


@functools.cache
def field_choices(cls: type) -> dict[str, tuple]:
    """{field name: its allowed values} for the fields typed with a Literal; None is among
    them where the hint allows it (`QuantizationMethods | None`)."""
    hints = typing.get_type_hints(cls)
    choices = {}
    for f in fields(cls):
        inner, optional = split_optional(hints[f.name])
        if typing.get_origin(inner) is Literal:
            choices[f.name] = typing.get_args(inner) + ((None,) if optional else ())
    return choices


def check_choices(config: object) -> None:
    """ValueError naming the first field whose value is not among its Literal's values."""
    for name, allowed in field_choices(type(config)).items():
        value = getattr(config, name)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_minimums(config: object, minimums: dict[str, float]) -> None:
    """ValueError naming the first field (None is let through) below its minimum."""
    for name, minimum in minimums.items():
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")


AUTO_MAX_MODEL_LEN = ("auto", -1)  # vLLM's spellings of "fit the model and the KV cache"
# vLLM's human_readable_int: lowercase suffixes are powers of 1000 (decimals allowed),
# uppercase ones powers of 1024 (whole numbers only)
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")


def human_readable_int(text: str) -> int:
    """An int from text such as 2048, 1k (1000), 1K (1024), 1.5m (1500000); ValueError else."""
    text = text.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"decimals are not allowed with the binary suffix {suffix!r} in "
                         f"{text!r}; did you mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def _length(text: str) -> int | str:
    """A max_model_len from text; ValueError with the reason otherwise."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return human_readable_int(text)
    except ValueError as e:
        if "suffix" in str(e):
            raise
        raise ValueError("not a token count (e.g. 4096, 4k = 4000, 4K = 4096, auto or -1)"
                         ) from None


def max_model_len_arg(text: str) -> int | str:
    """argparse type of --max-model-len: a token count (human-readable: 1k, 32K), or auto (-1)."""
    try:
        return _length(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def normalize_max_model_len(value: int | str | None) -> int | None:
    """max_model_len as a count >= 1, or None for auto; a string read as --max-model-len's."""
    if isinstance(value, str):
        try:
            value = _length(value)
        except ValueError as e:
            raise ValueError(f"max_model_len {value!r}: {e}") from None
    if value is None or value in AUTO_MAX_MODEL_LEN:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_model_len must be >= 1, auto or -1, got {value!r}")
    return value


def hf_rope_dict(hf_config: dict) -> dict:
    """config.json's rope parameters as transformers 5 standardizes them: a legacy rope_scaling
    replaces rope_parameters, rope_type falls back to its older spelling `type` (then default),
    and a top-level original_max_position_embeddings wins (Phi-3's rule) where one is read."""
    params = dict(hf_config.get("rope_scaling") or hf_config.get("rope_parameters") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    original = hf_config.get("original_max_position_embeddings")
    if original is not None and params["rope_type"] in ("llama3", "yarn", "longrope"):
        params["original_max_position_embeddings"] = original
    return params


# the config.json keys that bound the sequence length, as vLLM reads them (the smallest wins)
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")


def model_len_bounds(hf_config: dict) -> tuple[int, int]:
    """(limit, default) of max_model_len for an HF config, derived as vLLM does: the smallest
    length key (2048 when there is none), times the rope scaling factor for linear and dynamic
    scaling (yarn: its original length times the factor; not Gemma 3's, already scaled).
    Dynamic NTK's base changes past the trained (original) length, so above it every
    position differs: its default stays there and only an explicit value goes past it.
    LongRoPE's default is its whole length (a longer prompt reads its own long rows)."""
    lengths = [hf_config[key] for key in _LENGTH_KEYS if isinstance(hf_config.get(key), int)]
    trained = min(lengths, default=2048) - _position_offset(hf_config)
    scaling = hf_rope_dict(hf_config)
    kind, factor = scaling["rope_type"], scaling.get("factor")
    original = scaling.get("original_max_position_embeddings")
    if kind == "yarn" and original is not None:  # HF's factor null: the ratio of the lengths
        factor = factor or hf_config.get("max_position_embeddings", trained) / original
        trained = original
    # Gemma 3's max_position_embeddings is the scaled length already (vLLM's exception)
    scales = kind in ("linear", "dynamic", "yarn") and "gemma3" not in str(
        hf_config.get("model_type", ""))
    limit = int(trained * float(factor or 1.0)) if scales else trained
    default = trained if kind == "dynamic" else limit
    # served within one chunk, or within index_topk tokens: the limit, and the default
    caps = [cap for cap in (_attention_chunk(hf_config), _index_topk(hf_config)) if cap]
    return (min(limit, *caps), min(default, *caps)) if caps else (limit, default)


def _position_offset(hf_config: dict) -> int:
    """Rows of the position table before position 0: RoBERTa's start after the padding id."""
    if hf_config.get("model_type") not in ("roberta", "xlm-roberta"):
        return 0
    pad = hf_config.get("pad_token_id")
    return (1 if pad is None else int(pad)) + 1


def _attention_chunk(hf_config: dict) -> int | None:
    """Llama 4's attention_chunk_size where it has chunked_attention layers (layer_types, else
    its RoPE layers), else None: within one chunk chunked attention is plain causal attention,
    and the attention op has no chunked mask."""
    chunk = hf_config.get("attention_chunk_size")
    if not isinstance(chunk, int) or isinstance(chunk, bool):
        return None
    layer_types = hf_config.get("layer_types")
    if layer_types:
        return chunk if "chunked_attention" in layer_types else None
    return chunk if hf_config.get("model_type") == "llama4_text" else None


# transformers' model types with DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5, A.X-K2)
_DSA_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa", "axk2")


def _index_topk(hf_config: dict) -> int | None:
    """DeepSeek Sparse Attention's index_topk (transformers' default 2048 where config.json
    leaves it out), else None: within index_topk tokens its indexer picks every causally
    visible key (plain causal attention), and the attention op has no sparse mask."""
    if hf_config.get("model_type") not in _DSA_MODEL_TYPES:
        return None
    topk = hf_config.get("index_topk", 2048)
    return topk if isinstance(topk, int) and not isinstance(topk, bool) and topk > 0 else None


def triton_takes_head_dim(head_dim: int) -> bool:
    """Whether the Triton attention kernels take head_dim: a power of two >= 16."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


def attention_backend_for(name: str, device_type: str, head_dim: int | None) -> str:
    """The backend `name` picks: auto takes Triton on CUDA where its kernels take head_dim,
    else the torch backend (correct at any head_dim, slower), warning once per engine;
    ValueError for "triton" at a head_dim its kernels do not take."""
    takes = head_dim is None or triton_takes_head_dim(head_dim)
    if name == "triton" and not takes:
        raise ValueError(f'attention_backend="triton" needs a head_dim that is a power of two '
                         f'>= 16; this model has {head_dim} (use "auto" or "torch")')
    if name != "auto":
        return name
    if device_type == "cuda" and not takes:
        logging.getLogger(__name__).warning(
            "head_dim %d: the Triton attention kernels take powers of two >= 16; attention "
            "runs on the torch backend (slower)", head_dim)
    return "triton" if device_type == "cuda" and takes else "torch"


# vLLM's hf_overrides: config.json keys replaced (a sub-config's key by key, merged_config),
# served from a directory of links to the checkpoint's files and the merged config.json, so
# that every reader of the model directory (loader, tokenizer, other processes) sees one config
MARKER = "compiled_llm_hf_overrides.json"  # {"source": model as given, "overrides": {...}}


def check_hf_overrides(value: Any) -> dict | None:
    """The overrides as a dict (None for none); ValueError naming hf_overrides otherwise."""
    if value is None or value == {}:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"hf_overrides must be a JSON object: {exc}") from None
    if callable(value):
        raise ValueError("hf_overrides: a callable is not supported; give a dict of "
                         "config.json keys")
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"hf_overrides must be a dict of config.json keys, got {value!r}")
    return value


def overlay_model_dir(model: str, overrides: dict) -> str:
    """A directory holding model's files (linked) and its config.json with overrides applied;
    the same model, config and overrides give the same directory (made once)."""
    source = Path(model).resolve()
    config_path = source / "config.json"
    if not config_path.is_file():
        raise ValueError(f"hf_overrides: {model} has no config.json to override")
    config = merged_config(json.loads(config_path.read_text()), overrides)
    key = hashlib.sha256(json.dumps([str(source), config], sort_keys=True).encode()).hexdigest()
    out = cache_root() / "hf_overrides" / key[:20]
    if not (out / MARKER).is_file():
        _build(out, source, config, {"source": model, "overrides": overrides})
    return str(out)


def merged_config(config: dict, overrides: dict) -> dict:
    """config with overrides' keys replaced, as vLLM updates an HF config: a sub-config
    (text_config, vision_config: a dict with a model_type) takes a dict's keys one by one,
    any other value (rope_scaling included) is replaced whole."""
    out = dict(config)
    for key, value in overrides.items():
        old = out.get(key)
        nested = isinstance(old, dict) and "model_type" in old and isinstance(value, dict)
        out[key] = merged_config(old, value) if nested else value
    return out


def _build(out: Path, source: Path, config: dict, marker: dict) -> None:
    """Fill a fresh directory beside out, then move it into place (several processes may race:
    the first one's stays)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out.parent))
    for entry in source.iterdir():
        if entry.name not in ("config.json", MARKER):
            os.symlink(entry, staging / entry.name)
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    (staging / MARKER).write_text(json.dumps(marker))
    try:
        os.rename(staging, out)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)


def overlay_source(path: str | os.PathLike | None) -> str | None:
    """The model as given, where path is an overrides directory; else None."""
    if path is None:
        return None
    marker = Path(path) / MARKER
    return json.loads(marker.read_text())["source"] if marker.is_file() else None
