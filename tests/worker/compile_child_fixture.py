"""Stand-ins for Triton JIT functions that compile children import by module and name: each
preload writes the file its specialization names (or fails)."""

import time
from pathlib import Path


class StandIn:
    """What a child calls (preload) and what the parent reads (fn's module and name)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def preload(self, specialization: str) -> None:
        """Compile: write "compiled" to the file the specialization names."""
        if self.fn.__name__ == "broken":
            raise RuntimeError("cannot compile")
        if self.fn.__name__ == "stuck":
            time.sleep(120)
        print("a library's chatter on stdout")
        Path(specialization).write_text("compiled")


def kernel():
    """The stand-in's function."""


def broken():
    """A stand-in whose compile fails."""


def stuck():
    """A stand-in whose compile never ends."""


kernel = StandIn(kernel)  # noqa: F811 (a JIT function replaces its function under its name)
broken = StandIn(broken)  # noqa: F811
stuck = StandIn(stuck)  # noqa: F811
