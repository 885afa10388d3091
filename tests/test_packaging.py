"""Every package in the source tree is listed in pyproject.toml, so a plain (non-editable)
install ships it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = {"compiled_llm": ROOT / "compiled_llm", **{
        name: ROOT / path for name, path in conf["package-dir"].items()}}
    found = set()
    for name, path in dirs.items():
        for init in path.rglob("__init__.py"):
            rel = init.parent.relative_to(path).parts
            if "data" in rel or (name == "compiled_llm" and rel[:1] in (("models",), ("passes",))):
                continue
            found.add(".".join((name, *rel)))
    assert found == listed
