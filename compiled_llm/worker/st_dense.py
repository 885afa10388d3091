"""sentence-transformers' Dense modules (modules.json after the Pooling one: LaBSE,
distiluse, EmbeddingGemma-style projections) as one projector run on the pooled vectors, before
normalisation, as sentence-transformers and vLLM run them. Modules that would change an
embedding in a way not implemented here are refused by name, never skipped."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from compiled_llm.worker.loader import checkpoint_files, iter_tensors, read_json

# module types that run after the encoder without changing the vectors' values here
_HANDLED = (".Pooling", ".Normalize")


def st_projector(model_dir: str | Path, device: torch.device) -> nn.Module | None:
    """The directory's Dense modules as one float32 Sequential on `device` (Linear, then its
    activation, per module), or None where modules.json has none. ValueError for another
    module type after the encoder (LayerNorm, CNN, LSTM ...)."""
    modules = read_json(Path(model_dir) / "modules.json")
    if not isinstance(modules, list):
        return None
    layers: list[nn.Module] = []
    for module in modules[1:]:  # the first is the encoder itself
        kind = str(module.get("type", ""))
        if kind.endswith(".Dense"):
            layers += _dense(Path(model_dir) / module.get("path", ""))
        elif not kind.endswith(_HANDLED):
            raise ValueError(f"{model_dir}/modules.json: module {kind!r} is not supported "
                             "(Pooling, Dense and Normalize are)")
    return nn.Sequential(*layers).float().to(device).eval() if layers else None


def _dense(path: Path) -> list[nn.Module]:
    """One Dense module: its Linear with the stored weights, then its activation."""
    config = read_json(path / "config.json")
    linear = nn.Linear(config["in_features"], config["out_features"],
                       bias=config.get("bias", True))
    state = _state_dict(path)
    linear.load_state_dict({key.removeprefix("linear."): value for key, value in state.items()})
    return [linear, _activation(config.get("activation_function"), path)]


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The module's weights, read as a checkpoint's are (safetensors, else .bin)."""
    return {name: tensor for name, tensor, _ in iter_tensors(checkpoint_files(path, "auto"))}


def _activation(name: str | None, path: Path) -> nn.Module:
    """A torch.nn activation class by its dotted name (Identity where none is named)."""
    if not name:
        return nn.Identity()
    module_name, _, class_name = name.rpartition(".")
    if not module_name.startswith("torch.nn"):
        raise ValueError(f"{path}/config.json: activation_function {name!r} is not a torch.nn "
                         "class")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"{path}/config.json: activation_function {name!r} is not a torch.nn "
                         "module")
    return cls()
