"""`--config FILE`: a YAML mapping of flag names to values, read as if its flags came first on
the command line (so the command line's own flags win), as vLLM's --config file is."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

DEST = "config_file"


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """The --config flag of a subcommand that takes engine or server flags."""
    parser.add_argument("--config", dest=DEST, default=None, metavar="YAML",
                        help="a YAML file of flags (key: value, keys spelt as the flags "
                             "without their dashes); flags given on the command line win")


def config_path(argv: list[str]) -> str | None:
    """The file a command line's --config names (--config FILE or --config=FILE), if any."""
    for index, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg.startswith("--config="):
            return arg.partition("=")[2]
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def yaml_flags(path: str) -> list[str]:
    """The command-line flags of a YAML mapping: `key: value` is --key VALUE, true --key,
    false --no-key, a list --key A B (a repeated flag's: --key A --key B), a mapping --key
    JSON. ValueError naming the file."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"config: cannot read {path}: {exc}") from None
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise ValueError(f"config: {path} must hold a mapping of flag names to values")
    if "config" in loaded:
        raise ValueError(f"config: {path} names another config file; give its flags instead")
    return [arg for key, value in loaded.items() for arg in _flag(str(key), value)]


def _repeated() -> frozenset[str]:
    """Flags given once per value (--middleware A --middleware B), by field name."""
    from compiled_llm.entrypoints.server.server_config import ServerConfig

    return frozenset(field.name for field in dataclasses.fields(ServerConfig)
                     if field.metadata.get("repeat"))


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.lstrip("-")
    if isinstance(value, bool):
        return [name] if value else ["--no-" + key.lstrip("-")]
    if isinstance(value, list) and key.lstrip("-").replace("-", "_") in _repeated():
        return [arg for v in value for arg in (name, str(v))]
    if isinstance(value, list):
        return [name, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
    if isinstance(value, dict):
        return [name, json.dumps(value)]
    return [name, str(value)]


def expand_config(argv: list[str], path: str) -> list[str]:
    """argv without its --config flag, the file's flags placed before its first flag (after
    the subcommand and any positional model)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--config":
            skip = True
        elif not arg.startswith("--config="):
            rest.append(arg)
    first_flag = next((i for i, arg in enumerate(rest) if arg.startswith("-")), len(rest))
    return rest[:first_flag] + yaml_flags(path) + rest[first_flag:]
