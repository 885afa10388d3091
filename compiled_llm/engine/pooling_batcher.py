"""Cross-request batching for the pooling engine: embed/classify calls from many threads (one
per server request) queue while a forward runs and reach the engine together, so concurrent
requests share forwards. One thread of its own runs the engine; a joint call that fails is
retried request by request, so a bad request fails alone and the others are served."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from compiled_llm.engine.pooling_engine import PoolingEngine


@dataclass
class _Call:
    """One request's sequences and params, waiting for its slice of a joint run."""

    kind: str  # "embed" or "classify"
    seqs: list
    params: list
    done: threading.Event = field(default_factory=threading.Event)
    result: list | None = None
    error: BaseException | None = None


class BatchingPoolingEngine:
    """A PoolingEngine whose embed and classify calls, made from any thread, are coalesced by
    kind into joint engine runs on one engine thread; everything else is the engine's own.
    Invariant: each call gets exactly its own rows, in its order."""

    def __init__(self, engine: PoolingEngine) -> None:
        self._engine = engine
        self._pending: list[_Call] = []
        self._cond = threading.Condition()
        self._tokenizer_lock = threading.Lock()  # HF tokenizers are not safe across threads
        self._closed = False
        self.joint_runs = 0  # engine runs made, each for one or more calls
        self._thread = threading.Thread(target=self._loop, name="pooling-engine", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def tokenize(self, *args, **kwargs):
        """The engine's tokenize, one thread at a time."""
        with self._tokenizer_lock:
            return self._engine.tokenize(*args, **kwargs)

    def tokenize_many(self, *args, **kwargs):
        """The engine's tokenize_many, one thread at a time."""
        with self._tokenizer_lock:
            return self._engine.tokenize_many(*args, **kwargs)

    def tokenize_pair(self, *args, **kwargs):
        """The engine's tokenize_pair, one thread at a time."""
        with self._tokenizer_lock:
            return self._engine.tokenize_pair(*args, **kwargs)

    def with_tokenizer(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), a call on the tokenizer, one thread at a time (as tokenize)."""
        with self._tokenizer_lock:
            return fn(*args, **kwargs)

    def embed(self, seqs: list, params: list) -> list[list[float]]:
        """The engine's embed, run jointly with the embed calls queued beside it."""
        return self._submit(_Call("embed", seqs, params))

    def classify(self, seqs: list, params: list) -> list[list[float]]:
        """The engine's classify, run jointly with the classify calls queued beside it."""
        return self._submit(_Call("classify", seqs, params))

    def _submit(self, call: _Call) -> list:
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is shut down")
            self._pending.append(call)
            self._cond.notify()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                kind = self._pending[0].kind
                batch = [c for c in self._pending if c.kind == kind]
                self._pending = [c for c in self._pending if c.kind != kind]
            self._run(kind, batch)

    def _run(self, kind: str, batch: list[_Call]) -> None:
        run = getattr(self._engine, kind)
        if len(batch) > 1 and self._run_joint(run, batch):
            return
        for call in batch:  # alone, or again one by one after a failed joint run
            self.joint_runs += 1
            try:
                call.result = run(call.seqs, call.params)
            except BaseException as exc:  # the caller's thread re-raises it
                call.error = exc
            call.done.set()

    def _run_joint(self, run, batch: list[_Call]) -> bool:
        """One engine run for every call of the batch; False (nothing set) if it raised."""
        self.joint_runs += 1
        try:
            rows = run([s for c in batch for s in c.seqs], [p for c in batch for p in c.params])
        except Exception:
            return False
        start = 0
        for call in batch:
            call.result, start = rows[start:start + len(call.seqs)], start + len(call.seqs)
            call.done.set()
        return True

    def shutdown(self) -> None:
        """Serve what is queued, stop the engine thread, free the engine (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._engine.shutdown()
