"""Child processes that compile Triton kernels into the parent's Triton cache directory, one
JSON line per kernel ({"module", "name", "spec"}: Triton's specialization data) on stdin and one
answer line each on stdout. Processes, not threads: Triton's compile holds the interpreter's lock
for much of its time. `python -m compiled_llm.worker.compile_children [DEVICE]` is one child."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import subprocess
import sys
import time

TIMEOUT_S = 600.0  # the most a start-up waits for its compile children


class CompileChildren:
    """`count` children started now (their imports overlap the parent's work); submit()
    hands each kernel to the next in turn, wait() closes their input and counts failures."""

    def __init__(self, count: int, device: int | None) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        argv = [sys.executable, "-m", __name__] + ([] if device is None else [str(device)])
        self.children = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          env=env, text=True) for _ in range(count)]
        self.submitted = 0

    def submit(self, module: str, name: str, spec: str) -> None:
        """Queue one kernel's compile (a child that died already is counted by wait())."""
        child = self.children[self.submitted % len(self.children)]
        self.submitted += 1
        with contextlib.suppress(OSError):
            child.stdin.write(json.dumps({"module": module, "name": name, "spec": spec}) + "\n")
            child.stdin.flush()

    def wait(self, timeout_s: float = TIMEOUT_S) -> list[str]:
        """Every queued compile finished (the children exit; one still running after
        timeout_s in all is killed); the failures' messages (their kernels compile again at
        their first launch, which says why)."""
        for child in self.children:
            with contextlib.suppress(OSError):
                child.stdin.close()
            child.stdin = None  # closed: communicate() must not flush it
        deadline = time.monotonic() + timeout_s
        answers = []
        for child in self.children:
            try:
                out, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                out, _ = child.communicate()
            answers += _answers(out)
        errors = [a.get("error", "?") for a in answers if not a.get("ok")]
        return errors + ["no answer: a compile child exited early or was stopped"] * (
            self.submitted - len(answers))


def _answers(out: str) -> list[dict]:
    """The answer lines of a child's output (anything else a library printed is skipped)."""
    answers = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and "ok" in answer:
                answers.append(answer)
    return answers


def compile_one(job: dict) -> None:
    """Compile one kernel: the module's JIT function preloaded from its specialization."""
    module = importlib.import_module(job["module"])
    kernel = functools.reduce(getattr, job["name"].split("."), module)
    kernel.preload(job["spec"])


def main() -> None:
    """One child: the imports first (while the parent is busy), then the jobs on stdin."""
    import torch
    import triton  # noqa: F401

    if len(sys.argv) > 1 and torch.cuda.is_available():
        torch.cuda.set_device(int(sys.argv[1]))
    for line in sys.stdin:
        try:
            compile_one(json.loads(line))
            answer = {"ok": True}
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which goes on)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
