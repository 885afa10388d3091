"""An engine core's interpreter started ahead of need: `compiled-llm serve` starts one first, so
the core's imports (torch, Dynamo, Inductor) overlap the front end's (server stack, transformers,
tokenizer); start_core_process hands it its arguments on stdin. One no engine takes is ended
at exit (or reads end-of-file if its front end dies). No torch here: the CLI imports this."""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import sys

# (module, new_session) -> the interpreter started for it, not yet taken
_waiting: dict[tuple[str, bool], subprocess.Popen] = {}


def spawn(module: str, new_session: bool = False) -> subprocess.Popen:
    """A fresh interpreter running compiled_llm.engine.<module>, its stdin a pipe."""
    # a fresh interpreter, not multiprocessing's spawn: that re-runs the caller's main
    # module, which a script without a __main__ guard cannot survive
    return subprocess.Popen([sys.executable, "-m", f"compiled_llm.engine.{module}"],
                            stdin=subprocess.PIPE, start_new_session=new_session)


def prestart(module: str, new_session: bool = False) -> None:
    """Start the interpreter of the next core process of this module and session now."""
    key = (module, new_session)
    if key in _waiting:
        return
    if not _waiting:
        atexit.register(discard)
    _waiting[key] = spawn(module, new_session)


def take(module: str, new_session: bool = False) -> subprocess.Popen:
    """The interpreter prestart() started for this module and session if it still runs,
    else a fresh one; any other waiting interpreter is ended (the guess was wrong)."""
    process = _waiting.pop((module, new_session), None)
    discard()
    if process is None or process.poll() is not None:
        return spawn(module, new_session)
    return process


def discard() -> None:
    """End the interpreters started ahead that no engine took (they hold nothing yet but
    their imports: no need to let those finish)."""
    while _waiting:
        _, process = _waiting.popitem()
        with contextlib.suppress(OSError):
            process.stdin.close()
        process.kill()
        process.wait()
