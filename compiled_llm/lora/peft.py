"""PEFT adapter directories (adapter_config.json + adapter_model.safetensors) read into per-module
LoRA weights, checked against the model's projections: rank, target modules, tensor shapes.
Every error is a ValueError naming the field (lora_path, max_lora_rank, target_modules)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

# projection name -> the module holding it in the decoder layers (the Llama family's names)
LORA_TARGETS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_PREFIXES = ("base_model.model.", "base_model.")
_KEY = re.compile(r"(?P<module>.+)\.lora_(?P<part>[AB])(?:\.default)?\.weight$")


@dataclass
class LoRAWeights:
    """One adapter on the host: module name -> (A [r, in], B [out, r] times the scaling)."""

    rank: int
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]


def lora_module_shapes(config) -> dict[str, tuple[int, int]]:
    """Module name -> (in_features, out_features) of every projection an adapter may target,
    for a decoder config of the Llama family."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    dims = {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}
    return {f"model.layers.{layer}.{LORA_TARGETS[proj]}.{proj}": shape
            for layer in range(config.num_hidden_layers) for proj, shape in dims.items()}


def read_adapter_config(path: Path, max_rank: int) -> dict:
    """adapter_config.json, checked: a LoRA of rank <= max_rank on supported modules only."""
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"lora_path: no adapter_config.json in {path}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"lora_path: {config_file} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"lora_path: {config_file} is not a PEFT LoRA config")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_path: adapter rank r must be an int >= 1, got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"lora_path: adapter lora_alpha must be a number, got {alpha!r}")
    ranks = [rank, *_pattern(config, "rank_pattern", int).values()]
    _pattern(config, "alpha_pattern", (int, float))
    if max(ranks) > max_rank:
        raise ValueError(f"max_lora_rank: the adapter's rank {max(ranks)} exceeds max_lora_rank "
                         f"{max_rank}")
    for key, allowed in (("use_dora", (None, False)), ("bias", (None, "none")),
                         ("lora_bias", (None, False)), ("modules_to_save", (None, []))):
        if config.get(key) not in allowed:
            raise ValueError(f"lora_path: adapter {key}={config[key]!r} is not supported")
    _check_targets(config.get("target_modules"))
    return config


def _check_targets(targets: str | list[str] | None) -> None:
    """ValueError naming target_modules for a listed module the model cannot adapt. A str is
    PEFT's regex over full module names (kept as written in adapter_config.json): as vLLM, the
    tensors the adapter holds are checked instead, each against the model's modules."""
    if targets is None or isinstance(targets, str):
        return
    if not isinstance(targets, list) or not all(isinstance(name, str) for name in targets):
        raise ValueError(f"target_modules: must be a list of module names or PEFT's regex "
                         f"str, got {targets!r}")
    unknown = sorted({name.rsplit(".", 1)[-1] for name in targets} - set(LORA_TARGETS))
    if unknown:
        raise ValueError(f"target_modules: the model has no LoRA-able module {unknown} "
                         f"(supported: {sorted(LORA_TARGETS)})")


def _pattern(config: dict, key: str, kind) -> dict:
    """PEFT's rank_pattern or alpha_pattern (module-name regex -> value), checked."""
    pattern = config.get(key) or {}
    if not isinstance(pattern, dict) or not all(
            isinstance(v, kind) and not isinstance(v, bool) and v > 0 for v in pattern.values()):
        raise ValueError(f"lora_path: adapter {key} must map module names to positive "
                         f"numbers, got {pattern!r}")
    return pattern


def _pattern_value(pattern: dict, module: str, default):
    """PEFT's get_pattern_key: the first key matching the end of module's dotted name."""
    for key in pattern:
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return pattern[key]
        except re.error as exc:
            raise ValueError(f"lora_path: adapter pattern key {key!r} is not a regex "
                             f"({exc})") from None
    return default


def module_rank_and_scaling(config: dict, module: str) -> tuple[int, float]:
    """(r, lora_alpha / r) of one module, or lora_alpha / sqrt(r) with use_rslora; per-module
    r and alpha from rank_pattern and alpha_pattern, as PEFT builds them."""
    rank = _pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module,
                                 config.get("lora_alpha", config["r"])))
    return rank, alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    weights = path / "adapter_model.safetensors"
    pickled = path / "adapter_model.bin"  # PEFT's save_pretrained(safe_serialization=False)
    if not weights.is_file() and not pickled.is_file():
        raise ValueError(f"lora_path: no adapter_model.safetensors (or .bin) in {path}")
    from safetensors.torch import load_file

    source = weights if weights.is_file() else pickled
    try:
        if weights.is_file():
            return load_file(str(weights))
        tensors = torch.load(pickled, map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors and pickle raise their own types on a damaged file
        raise ValueError(f"lora_path: cannot read {source} ({exc})") from None
    if not isinstance(tensors, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()):
        raise ValueError(f"lora_path: {source} is not a dict of named tensors")
    return tensors


def _module_of(key: str) -> tuple[str, str] | None:
    match = _KEY.match(key)
    if match is None:
        return None
    module = match["module"]
    for prefix in _PREFIXES:
        if module.startswith(prefix):
            module = module[len(prefix):]
            break
    return module, match["part"]


def load_peft_adapter(lora_path: str, shapes: dict[str, tuple[int, int]], max_rank: int,
                      dtype: torch.dtype = torch.float32) -> LoRAWeights:
    """The adapter at lora_path as LoRAWeights in dtype (B scaled); ValueError naming the field
    when the directory is missing or damaged or the adapter does not fit the model."""
    path = Path(lora_path)
    if not path.is_dir():
        raise ValueError(f"lora_path: {lora_path!r} is not a directory")
    config = read_adapter_config(path, max_rank)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read_tensors(path).items():
        named = _module_of(key)
        if named is None:
            raise ValueError(f"lora_path: tensor {key!r} is not a LoRA A or B weight")
        module, part = named
        if module not in shapes:
            raise ValueError(f"target_modules: the model has no module {module!r}")
        parts.setdefault(module, {})[part] = tensor
    if not parts:
        raise ValueError(f"lora_path: {lora_path} holds no LoRA weights")
    modules = {}
    for module, pair in parts.items():
        rank, scale = module_rank_and_scaling(config, module)
        modules[module] = _checked_pair(module, pair, shapes[module], rank, scale, dtype)
    return LoRAWeights(max(a.shape[0] for a, _ in modules.values()), modules)


def _checked_pair(module: str, pair: dict[str, torch.Tensor], shape: tuple[int, int],
                  rank: int, scale: float, dtype: torch.dtype):
    if set(pair) != {"A", "B"}:
        raise ValueError(f"lora_path: module {module!r} lacks its lora_A or lora_B weight")
    in_features, out_features = shape
    lora_a, lora_b = pair["A"], pair["B"]
    if tuple(lora_a.shape) != (rank, in_features) or tuple(lora_b.shape) != (out_features, rank):
        raise ValueError(f"lora_path: {module!r} has lora_A {tuple(lora_a.shape)} and lora_B "
                         f"{tuple(lora_b.shape)}; the model needs {(rank, in_features)} and "
                         f"{(out_features, rank)}")
    if not (torch.isfinite(lora_a).all() and torch.isfinite(lora_b).all()):
        raise ValueError(f"lora_path: {module!r} holds non-finite weights")
    return lora_a.to(dtype), (lora_b.double() * scale).to(dtype)
