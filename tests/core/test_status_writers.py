"""The scheduler is the one writer of request status: no other module assigns `.status`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path("compiled_llm/core/scheduler.py")


def status_assignments(path: Path) -> list[int]:
    """Lines of path that assign `<obj>.status` (plain, augmented or tuple) for an obj other
    than self (an object keeping its own status, such as an HTTP error, is not a request)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            lines += [node.lineno for name in names
                      if isinstance(name, ast.Attribute) and name.attr == "status"
                      and not (isinstance(name.value, ast.Name) and name.value.id == "self")]
    return lines


def test_only_the_scheduler_writes_request_status():
    writers = {}
    for path in sorted((ROOT / "compiled_llm").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] in ("models", "passes") or rel == WRITER:
            continue
        if lines := status_assignments(path):
            writers[str(rel)] = lines
    assert not writers, f"request status written outside the scheduler: {writers}"
    assert status_assignments(ROOT / WRITER)  # the scanner does see the real writer
