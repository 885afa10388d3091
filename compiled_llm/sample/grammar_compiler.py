"""Grammar compilation off the caller's thread: each StructuredOutputsParams compiled once by
xgrammar on worker threads, LRU-cached, shared by concurrent callers, under a size limit and a
time limit (a spec that runs out of time stays refused), and matchers handed out from it."""

from __future__ import annotations

import functools
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from compiled_llm.sample.structured_outputs import ReasoningGate, grammar_text
from compiled_llm.sampling_params import StructuredOutputsParams

_CACHE_SIZE = 256  # compiled grammars kept
_REFUSED_SIZE = 1024  # specs remembered as too slow to compile


class _DaemonPool:
    """Worker threads that never hold the process at exit (a compile cannot be stopped)."""

    def __init__(self, workers: int, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        """fn(*args) on a worker; the future may be cancelled until a worker takes it."""
        job: Future = Future()
        self._jobs.put((job, fn, args))
        return job

    def _work(self) -> None:
        while True:
            job, fn, args = self._jobs.get()
            if not job.set_running_or_notify_cancel():
                continue
            try:
                job.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiter, which raises it
                job.set_exception(exc)


class GrammarManager:
    """Compiles specs for one tokenizer and vocab and hands out matchers. Invariant: no spec
    is compiled on a caller's thread, none twice at once, none over max_bytes, and no caller
    waits past timeout_s after its spec's compile was submitted.

    vocab_size is the model's: ids past the tokenizer's vocabulary are never allowed.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...],
                 max_bytes: int = 64 << 10, timeout_s: float = 10.0, workers: int = 2) -> None:
        import xgrammar as xgr

        self._xgr, self._tokenizer, self._stop_ids = xgr, tokenizer, stop_token_ids
        self.vocab_size, self.max_bytes, self.timeout_s = vocab_size, max_bytes, timeout_s
        self._pool = _DaemonPool(workers, "grammar")
        self._lock = threading.RLock()  # RLock: a cancelled job runs its callback in place
        self._compiler_lock = threading.Lock()
        self._compiler = None  # built on a worker at first use (costly for a large vocab)
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._pending: dict[tuple, Future] = {}
        self._refused: OrderedDict[tuple, str] = OrderedDict()

    @property
    def num_cached(self) -> int:
        """Compiled grammars held in the LRU cache."""
        return len(self._cache)

    def prepare(self, spec: StructuredOutputsParams) -> Future:
        """A future of spec's compiled grammar, failing with a ValueError (naming the field)
        if the spec does not compile or not within timeout_s; ValueError at once for a spec
        over max_bytes or one that already ran out of time. Thread-safe."""
        key = spec.key()
        size = len(key[1].encode("utf-8"))
        if size > self.max_bytes:
            raise ValueError(f"structured_outputs.{spec.kind} is {size} bytes; this engine "
                             f"compiles at most {self.max_bytes} (structured_outputs_max_bytes)")
        with self._lock:
            if key in self._refused:
                raise ValueError(self._refused[key])
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                done: Future = Future()
                done.set_result(hit)
                return done
            return self._pending.get(key) or self._start(spec, key)

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar for spec, waiting for it (at most timeout_s); ValueError
        naming the field when it is refused."""
        return self.prepare(spec).result()

    def matcher(self, spec: StructuredOutputsParams):
        """A fresh matcher at the start of spec's grammar (behind a ReasoningGate when the
        reply starts in a thinking span)."""
        matcher = self._xgr.GrammarMatcher(self.compile(spec))
        end_id = spec.reasoning_end_token_id
        return matcher if end_id is None else ReasoningGate(matcher, end_id)

    def _start(self, spec: StructuredOutputsParams, key: tuple) -> Future:
        waiter: Future = Future()
        self._pending[key] = waiter
        job = self._pool.submit(self._compile, spec)
        timer = threading.Timer(self.timeout_s, self._expire, (key, waiter, job))
        timer.daemon = True
        timer.start()
        job.add_done_callback(functools.partial(self._finished, key, waiter, timer))
        return waiter

    def _finished(self, key: tuple, waiter: Future, timer: threading.Timer, job: Future) -> None:
        timer.cancel()
        with self._lock:
            if self._pending.get(key) is waiter:
                del self._pending[key]
            if job.cancelled() or waiter.done():  # it ran out of time: the result is dropped
                return
            if job.exception() is not None:
                waiter.set_exception(job.exception())
                return
            self._cache[key] = job.result()
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
            waiter.set_result(job.result())

    def _expire(self, key: tuple, waiter: Future, job: Future) -> None:
        with self._lock:
            if waiter.done():
                return
            if self._pending.get(key) is waiter:
                del self._pending[key]
            limit = f"{self.timeout_s:g} s (structured_outputs_timeout_s)"
            if job.cancel():  # never started: the compiler was busy, try again later
                message = f"structured_outputs: the grammar compiler is busy; not compiled " \
                          f"within {limit}"
            else:  # it would take as long again: refuse this spec from now on
                message = f"structured_outputs: the grammar did not compile within {limit}"
                self._refused[key] = message
                if len(self._refused) > _REFUSED_SIZE:
                    self._refused.popitem(last=False)
            waiter.set_exception(ValueError(message))

    def _compile(self, spec: StructuredOutputsParams):
        """On a worker thread: the compiled grammar, or ValueError naming the field."""
        compiler = self._get_compiler()
        try:
            text = grammar_text(self._xgr, spec)
            if text is None:
                return compiler.compile_regex(spec.regex)
            return compiler.compile_grammar(text)
        except Exception as exc:  # xgrammar reports parse errors as RuntimeError
            reason = _reason(exc)
            raise ValueError(f"structured_outputs.{spec.kind} is invalid: {reason}") from None

    def _get_compiler(self):
        with self._compiler_lock:
            if self._compiler is None:
                xgr = self._xgr
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=list(self._stop_ids) or None)
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler


def _reason(exc: Exception) -> str:
    """The message of a failed compile: a ValueError of ours as it is, xgrammar's last line
    without its location prefixes ("[time] file.cc:12: Check failed: ...")."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    if type(exc) is ValueError:
        return text
    return text.splitlines()[-1].split(": ", 1)[-1]
