"""Compile child processes: Triton kernels into the parent's Triton cache, one JSON line per
kernel ({"module", "name", "spec"}) on stdin, one answer line each on stdout (processes: Triton's
compile holds the interpreter's lock). Warm children (`--inductor-threads=N`) set up Inductor
first, then also compile the backend's pieces ({"piece": job file, "id"}: side_compile).
`python -m compiled_llm.worker.compile_children [DEVICE] [--inductor-threads=N]` is one child."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time

from compiled_llm.optimization import side_piece_compile_wanted
from compiled_llm.worker import warm_hint

logger = logging.getLogger(__name__)

TIMEOUT_S = 600.0  # the most a start-up waits for its compile children
PARALLEL_ENV = "COMPILED_LLM_PARALLEL_TRITON_COMPILE"  # 0: no side-by-side compiles on CUDA
# warm children for the backend's pieces: a plain decoder has three unique pieces (the first,
# the repeated layer, the last)
PIECE_CHILDREN = 3
GO_TIMEOUT_S = 600.0  # an early child that gets no go line by then exits


class _Child:
    """One child, fed by a writer thread and drained by a reader thread, so the parent never
    blocks on a pipe, whatever the child does."""

    def __init__(self, argv: list[str], env: dict, warm: bool = False) -> None:
        self.warm = warm  # takes pieces (its Inductor is set up at its start)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)
        self.jobs: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.answers: list[dict] = []
        self.piece_ids: set[int] = set()
        self.sent = 0  # jobs queued for this child
        self.reader = threading.Thread(target=self._read, daemon=True, name="triton-compile-io")
        for thread in (threading.Thread(target=self._write, daemon=True,
                                        name="triton-compile-io"), self.reader):
            thread.start()

    def _write(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a child gone: wait() counts it
            while (line := self.jobs.get()) is not None:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):  # a library's chatter is skipped
                answer = json.loads(line)
                if isinstance(answer, dict) and "ok" in answer:
                    self.answers.append(answer)

    def finish(self, deadline: float) -> None:
        """No more jobs: once every job sent has its answer (or the child is gone, or the
        deadline passed) the child is killed, not waited for: a process that made a CUDA
        context takes seconds to exit (5 s of an 8B cold start in call 58), and each answer
        comes after its kernel is in Triton's cache. Reaped by a daemon thread."""
        self.jobs.put(None)
        while (len(self.answers) < self.sent and self.proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.005)
        self.proc.kill()
        if len(self.answers) < self.sent:  # gone or late: its last lines may still be in the pipe
            self.reader.join(timeout=2.0)
        self._reap()

    def stop(self) -> None:
        """Close its stdin and kill it now (it may have exited already)."""
        self.jobs.put(None)
        self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        threading.Thread(target=self.proc.wait, daemon=True, name="triton-compile-reap").start()


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _argv(device: int | None) -> list[str]:
    return [sys.executable, "-m", __name__] + ([] if device is None else [str(device)])


def _threads_flag(warm: int) -> str:
    """The warm children's Inductor workers share the machine's CPUs."""
    return f"--inductor-threads={max(1, usable_cpus() // max(1, warm))}"


def start_early(count: int, device: int | None) -> list[_Child]:
    """`count` warm children started before the parent knows it compiles (before its
    weights): they import the compiler, then wait for the go line that CompileChildren sends
    when it takes them, touching no device before it; stop_early ends those never taken."""
    argv = _argv(device) + [_threads_flag(count), "--await-go"]
    return [_Child(argv, _env(), warm=True) for _ in range(count)]


_started: list[tuple[str, _Child]] = []  # (device, child) made ahead of the worker
_said_hinted: list[bool] = []  # the hint's log line, once a process


def start_early_children(device, args) -> None:
    """Start the warm children now, before the weights are read (an engine core process or
    `compiled-llm compile` with its arguments), for this process's worker to take."""
    if not _started:
        _started.extend((str(device), child) for child in _start_warm(device, args, None))


def early_children(device, args, tp) -> list[_Child]:
    """The warm children for the backend's pieces (start_early_children's, else started now)
    wherever a cold start would take them: a lone backend worker with side-by-side pieces on
    (on CUDA, side-by-side Triton compiles on too); [] elsewhere. The precompile pass (CUDA)
    or its side_pieces (elsewhere) takes them or stops them."""
    taken = [child for where, child in _started if where == str(device)]
    stop_early([child for where, child in _started if where != str(device)])
    _started.clear()
    return taken or _start_warm(device, args, tp)


def _start_warm(device, args, tp) -> list[_Child]:
    compile_cfg = args.compile_config()
    # the backend sends pieces only where it has a compile cache and makes no dumps
    sends = (compile_cfg.mode == "backend" and compile_cfg.use_cache and not compile_cfg.dump_dir
             and not os.environ.get("COMPILED_LLM_DISABLE_CACHE")
             and not os.environ.get("COMPILED_LLM_DUMP_DIR"))
    if tp is not None or args.world_size != 1 or not sends \
            or not side_piece_compile_wanted(device.type):
        return []
    if warm_hint.hinted_warm(args):
        if not _said_hinted:
            logger.info("warm-start hint found: no compile children started ahead")
            _said_hinted.append(True)
        return []
    if device.type != "cuda":
        return start_early(piece_children_count(), None)
    # each pins the worker's Triton cache dir itself
    return start_early(piece_children_count(), device.index or 0) if parallel_compiles_on() else []


def stop_early(children: list[_Child]) -> None:
    """End children from start_early (taken or not; each may have exited already)."""
    for child in children:
        child.stop()


def parallel_compiles_on() -> bool:
    """Whether side-by-side compiles on CUDA are switched on ($PARALLEL_ENV, default on)."""
    return os.environ.get(PARALLEL_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def piece_children_count() -> int:
    """How many warm children take pieces: PIECE_CHILDREN, leaving the parent a CPU."""
    return min(PIECE_CHILDREN, max(1, usable_cpus() - 1))


class CompileChildren:
    """`count` children started now (their imports overlap the parent's work), the first
    `warm` of them also setting up Inductor for pieces; submit() hands each kernel to the
    least busy child without blocking, wait() counts the failures."""

    def __init__(self, count: int, device: int | None = None, warm: int = 0,
                 early: list[_Child] = ()) -> None:
        self.children = list(early)  # started warm by start_early: told to go on now
        for child in self.children:
            child.jobs.put("go\n")
        fresh_warm = max(0, warm - len(self.children))
        argv, threads = _argv(device), _threads_flag(warm)
        self.children += [_Child(argv + [threads] if index < fresh_warm else argv, _env(),
                                 index < fresh_warm)
                          for index in range(max(0, count - len(self.children)))]
        self.submitted = 0  # kernel jobs
        self.pieces = 0  # piece jobs

    def submit(self, module: str, name: str, spec: str) -> None:
        """Queue one kernel's compile on the child with the fewest unanswered jobs (in turn,
        one long compile could hold a second one back while another child idled)."""
        self.submitted += 1
        self._send(self.children, {"module": module, "name": name, "spec": spec})

    def submit_piece(self, path: str) -> int:
        """Queue the piece job at path on the least busy warm child; its id."""
        warm = [child for child in self.children if child.warm]
        if not warm:
            raise RuntimeError("no compile child was started warm")
        self.pieces += 1
        self._send(warm, {"piece": path, "id": self.pieces})
        return self.pieces

    def piece_answer(self, job_id: int, timeout_s: float) -> dict | None:
        """The answer to piece job job_id, or None if there is no such job, its child exited
        or timeout_s passed (then the child is stopped: nothing waits on its late work)."""
        child = next((child for child in self.children if job_id in child.piece_ids), None)
        deadline = time.monotonic() + timeout_s
        while child is not None:
            gone = child.proc.poll() is not None and not child.reader.is_alive()
            for answer in child.answers:  # scanned once more after the child is gone
                if answer.get("id") == job_id:
                    return answer
            if gone:
                return None
            if time.monotonic() >= deadline:
                child.proc.kill()
                return None
            time.sleep(0.005)
        return None

    def _send(self, children: list[_Child], job: dict) -> None:
        child = min(children, key=lambda each: each.sent - len(each.answers))
        child.sent += 1
        if "id" in job:
            child.piece_ids.add(job["id"])
        child.jobs.put(json.dumps(job) + "\n")

    def wait(self, timeout_s: float = TIMEOUT_S) -> list[str]:
        """Every queued compile finished (then, or after timeout_s in all, the children are
        killed); the failures' messages (their kernels compile again at their first launch,
        which says why)."""
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            child.finish(deadline)
        answers = self.answers()
        errors = [answer.get("error", "?") for answer in answers if not answer["ok"]]
        return errors + ["no answer: a compile child exited early or was stopped"] * (
            self.submitted - len(answers))

    def answers(self) -> list[dict]:
        """Every kernel job's answer so far: ok, error, and the child's wall-clock
        ready/began/ended (the pieces' answers are piece_answer's)."""
        return [answer for child in self.children for answer in child.answers
                if "id" not in answer]

    def kill(self) -> None:
        """Stop every child now (start-up failed; their compiles are not needed)."""
        self.wait(timeout_s=0.0)


LAUNCHERS_ENV = "COMPILED_LLM_PRECOMPILE_LAUNCHERS"


def compile_one(job: dict) -> None:
    """Compile one kernel: the JIT function (a module attribute, else in Triton's registry)
    preloaded from its specialization, into Triton's cache, then loaded here, so that its
    launcher (a C module Triton 3.6 builds per signature with the host compiler, at the
    kernel's first launch) lands in the cache too, not on the parent's first launch
    ($COMPILED_LLM_PRECOMPILE_LAUNCHERS=0 leaves them there, for A/B runs)."""
    try:
        module = importlib.import_module(job["module"])
        kernel = functools.reduce(getattr, job["name"].split("."), module)
    except AttributeError:  # defined where no attribute reaches it
        from triton.runtime import jit

        kernel = jit._triton_jit_function_registry[f"{job['module']}:{job['name']}"]
    compiled = kernel.preload(job["spec"])
    load = getattr(compiled, "_init_handles", None)
    if load is not None and os.environ.get(LAUNCHERS_ENV, "1") != "0":
        load()


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run(job: dict) -> dict:
    """One job: a piece (side_compile) or a Triton kernel; the answer's fields."""
    if "piece" in job:
        from compiled_llm.compile.side_compile import compile_job

        return {"ok": True, "id": job["id"], **compile_job(job["piece"])}
    compile_one(job)
    return {"ok": True}


def _warm_up(device: str, flags: list[str]) -> None:
    """A warm child's Inductor set-up (its compile workers sized by the parent)."""
    threads = next((int(flag.split("=")[1]) for flag in flags
                    if flag.startswith("--inductor-threads=")), None)
    if threads is None:
        return
    import torch

    from compiled_llm.compile.side_compile import warm_up

    torch._inductor.config.compile_threads = threads
    try:
        warm_up(device)
    except Exception as exc:  # noqa: BLE001 (its pieces will say what fails)
        print(f"compile child warm-up failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _await_go() -> bool:
    """An early child: the compiler's imports, then whether the parent said go (no line by
    GO_TIMEOUT_S, or the parent's end: no)."""
    import torch._inductor.compile_fx  # noqa: F401

    import compiled_llm.compile.side_compile  # noqa: F401
    import compiled_llm.models  # noqa: F401 (the custom ops pieces may call)
    import compiled_llm.passes  # noqa: F401

    ready, _, _ = select.select([sys.stdin], [], [], GO_TIMEOUT_S)
    return bool(ready) and sys.stdin.readline() == "go\n"


def main() -> None:
    """One child: the imports and the device's context first, while the parent is busy (with
    the context made at the first job, call 53's compiles ended 5.3 s after its dry forwards,
    against 1.25 s in call 52), a warm child's Inductor set-up, then the jobs on stdin; the
    answers on the original stdout, anything else printed on stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch
    import triton  # noqa: F401

    flags = [arg for arg in sys.argv[1:] if arg.startswith("--")]
    devices = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    if "--await-go" in flags and not _await_go():
        return
    if devices and torch.cuda.is_available():
        from compiled_llm.compat import pin_triton_cache_dir

        pin_triton_cache_dir(int(devices[0]))  # the worker's (set unless inherited)
        torch.cuda.set_device(int(devices[0]))
    _warm_up(f"cuda:{devices[0]}" if devices else "cpu", flags)
    ready = time.time()
    for line in sys.stdin:
        began = time.time()
        job = {}
        try:
            job = json.loads(line)
            answer = _run(job)
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which goes on)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            if "id" in job:
                answer["id"] = job["id"]
        answer.update(ready=ready, began=began, ended=time.time())  # wall clock: the parent's
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
