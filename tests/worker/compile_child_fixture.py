"""Stand-ins for Triton JIT functions that compile children import by module and name: each
preload writes the file its specialization names (or fails), and loading what it returns
(a compiled kernel's _init_handles: its launcher) adds to that file."""

import time
from pathlib import Path


class StandIn:
    """What a child calls (preload) and what the parent reads (fn's module and name)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def preload(self, specialization: str) -> "Compiled":
        """Compile: write "compiled" to the file the specialization names."""
        if self.fn.__name__ == "broken":
            raise RuntimeError("cannot compile")
        if self.fn.__name__ == "stuck":
            time.sleep(120)
        print("a library's chatter on stdout")
        Path(specialization).write_text("compiled")
        return Compiled(Path(specialization))


class Compiled:
    """A compiled kernel's stand-in: loading it builds its launcher."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _init_handles(self) -> None:
        self.path.write_text(self.path.read_text() + " and loaded")


def kernel():
    """The stand-in's function."""


def broken():
    """A stand-in whose compile fails."""


def stuck():
    """A stand-in whose compile never ends."""


kernel = StandIn(kernel)  # noqa: F811 (a JIT function replaces its function under its name)
broken = StandIn(broken)  # noqa: F811
stuck = StandIn(stuck)  # noqa: F811
