"""Pass debugging dumps: per unique piece, its input graph, the pass manager's before/after
graphs and diffs, and the Inductor output code, under one directory per piece."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compiled_llm.compat import capture_inductor_code


class PieceDumper:
    """Owns one dump directory: a folder per unique piece compiled, indexed in pieces.json."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.index: list[dict] = []

    @contextmanager
    def piece(self, key: str, piece, post_grad_pass) -> Iterator[None]:
        """Dump around one piece's compile; the pass manager writes its own files there."""
        piece_dir = self.root / f"{len(self.index):02d}_{piece.name}_{key[:8]}"
        piece_dir.mkdir(parents=True, exist_ok=True)
        (piece_dir / "input_graph.py").write_text(piece.module.code)
        set_dump = getattr(post_grad_pass, "set_dump_dir", None)
        if set_dump:
            set_dump(str(self.root), piece_dir.name)  # pass dumps land in the piece's folder
        with capture_inductor_code() as codes:
            yield
        if set_dump:
            set_dump(None, piece.name)
        for i, code in enumerate(codes):
            (piece_dir / f"inductor_output_code_{i}.py").write_text(code)
        self.index.append({"piece": piece.name, "hash": key, "dir": piece_dir.name})
        (self.root / "pieces.json").write_text(json.dumps(self.index, indent=2))
