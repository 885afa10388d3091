"""Pass dumps: the graph as readable Python before and after every pass that changed it, a
unified diff per pass, and a summary table (pass, matches, seconds) in markdown and JSON."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from torch.fx import Graph


def graph_source(graph: Graph) -> str:
    """The graph as the Python Inductor would see it (falls back to the node listing)."""
    try:
        return graph.python_code(root_module="self").src.strip() + "\n"
    except Exception:  # noqa: BLE001 (a dump must never fail a compile)
        return str(graph)


def safe_name(name: str) -> str:
    """name with every run of characters unsafe in a file name replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "graph"


class GraphDump:
    """Writes one graph's dump under dump_dir/piece_name, one pass at a time."""

    def __init__(self, dump_dir: str, piece_name: str, graph: Graph) -> None:
        self.dir = Path(dump_dir) / safe_name(piece_name)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("[0-9][0-9]_*"):
            old.unlink()
        self.last = graph_source(graph)
        (self.dir / "00_before.py").write_text(self.last)
        self.rows: list[dict] = []

    def after_pass(self, index: int, name: str, matches: int, seconds: float,
                   graph: Graph) -> None:
        """Record a pass; writes its graph and diff only when it changed the graph."""
        src = graph_source(graph)
        changed = src != self.last
        if changed:
            stem = f"{index:02d}_{name}"
            (self.dir / f"{stem}.py").write_text(src)
            diff = difflib.unified_diff(self.last.splitlines(True), src.splitlines(True),
                                        f"before/{name}", f"after/{name}")
            (self.dir / f"{stem}.diff").write_text("".join(diff))
        self.rows.append({"index": index, "pass": name, "matches": matches,
                          "seconds": round(seconds, 6), "changed": changed})
        self.last = src

    def finish(self) -> None:
        """Write after.py (the graph handed to Inductor) and the summary tables."""
        (self.dir / "99_after.py").write_text(self.last)
        (self.dir / "summary.json").write_text(json.dumps(self.rows, indent=2) + "\n")
        lines = ["| # | pass | matches | ms | changed |", "|---|---|---:|---:|---|"]
        lines += [f"| {r['index']} | {r['pass']} | {r['matches']} | {r['seconds'] * 1e3:.2f} "
                  f"| {'yes' if r['changed'] else 'no'} |" for r in self.rows]
        (self.dir / "summary.md").write_text("\n".join(lines) + "\n")
