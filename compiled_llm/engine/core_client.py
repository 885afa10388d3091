"""CoreClient: the front end's handle on an engine core running in a process of its own
(core_proc). It starts the process (spawn: CUDA cannot be forked), or attaches to a core that
several front ends share (core_multi), sends requests, aborts and finishes as they happen, and
reads the outputs of each step. A core that dies is detected within a poll interval, and every
later call raises EngineDeadError instead of hanging."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import pickle
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref

import zmq

from compiled_llm.config import EngineArgs
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.request import Request
from compiled_llm.engine import core_prestart
from compiled_llm.engine.core_multi import HELLO, CoreEndpoint
from compiled_llm.engine.core_proc import (
    ABORT,
    ADD,
    CALL,
    FAILED,
    FINISH,
    OUTPUTS,
    READY,
    REPLY,
    SHUTDOWN,
    pack,
    unpack,
)
from compiled_llm.engine.core_types import CoreInfo, EngineStats
from compiled_llm.worker.spec import WorkerSpec

LIVENESS_POLL_MS = 200  # how often a waiting front end checks that the core is alive
SHUTDOWN_WAIT_S = 10.0


class EngineDeadError(RuntimeError):
    """The engine core process died; the engine cannot serve any more requests."""


class CoreClient:
    """The engine core in its own process, offering what the in-process core offers. One
    thread (the engine loop) drives it; get_stats may be called from any thread (reads from
    the core's socket hold a lock). With an endpoint it attaches to a shared core (which it
    neither starts nor stops) and prefixes its request ids with its client index, so they
    are unique among the core's front ends."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, eos_token_ids: tuple[int, ...],
                 endpoint: CoreEndpoint | None = None) -> None:
        self._owned = endpoint is None
        self._dir = tempfile.mkdtemp(prefix="compiled-llm-core-") if self._owned else None
        in_addr, out_addr = (self._addr("in"), self._addr("out")) if self._owned else \
            endpoint.addresses
        self.request_id_prefix = "" if self._owned else f"{endpoint.client_index}:"
        self._context = zmq.Context()
        self._to_core = self._bind(zmq.PUSH, in_addr)
        self._from_core = self._bind(zmq.PULL, out_addr)
        self._calls = itertools.count()
        self._replies: dict[int, tuple[bool, bytes]] = {}
        self._pending_outputs: list[EngineCoreOutput] = []
        self._dead: str | None = None
        self._reading = threading.Lock()  # a ZMQ socket is not thread-safe
        self._sending = threading.Lock()
        if self._owned:
            self.process = start_core_process(args, spec, eos_token_ids, [(in_addr, out_addr)])
            # a client dropped without shutdown() (del llm) still stops its core, which holds
            # the model and the KV cache; the finalizer holds the parts, never the client
            self._stop = weakref.finalize(self, _stop_core, self.process, self._to_core,
                                          self._from_core, self._context, self._dir)
        else:
            self.process = PeerProcess(endpoint.core_pid)
        try:
            if not self._owned:
                self._say_hello()
            self.info, self._stats = self._wait_ready()
        except BaseException:
            self.shutdown()
            raise

    def _addr(self, name: str) -> str:
        return f"ipc://{self._dir}/{name}"

    def _bind(self, kind: int, addr: str):
        sock = self._context.socket(kind)
        sock.bind(addr)
        return sock

    def _say_hello(self) -> None:
        """Tell a shared core this process's pid (it aborts our requests once we are gone);
        waits until the core has connected, or is found dead."""
        while True:
            try:
                return self._to_core.send(pack(HELLO, os.getpid()), zmq.NOBLOCK)
            except zmq.Again:
                self._check_alive()
                time.sleep(0.01)

    def _wait_ready(self) -> tuple[CoreInfo, EngineStats]:
        while True:
            if self._from_core.poll(LIVENESS_POLL_MS):  # before any other thread has it
                kind, payload = unpack(self._from_core.recv())
                if kind == READY:
                    return pickle.loads(payload)
                if kind == FAILED:
                    raise RuntimeError(f"engine core failed to start:\n{payload}")
            elif self.process.poll() is not None:
                raise RuntimeError(f"engine core process exited during start-up (exit code "
                                   f"{self.process.returncode})")

    # ------------------------------------------------------------------ requests
    def add_requests(self, reqs: list[Request]) -> None:
        """Send validated child requests; ValueError if one cannot cross to the process."""
        try:  # each request its own pickle: one that fails to load fails alone in the core
            blobs = [(req.request_id, _dumps_for_core(_portable(req))) for req in reqs]
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ValueError("sampling_params: logits_processors must be picklable to run in "
                             f"the engine core process ({exc})") from None
        self._send(ADD, blobs)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort these requests in the core (nothing to do once the core is gone)."""
        if self._dead is None and self.process.poll() is None:
            self._send(ABORT, list(request_ids))

    def finish_requests(self, finishes: list) -> None:
        """Tell the core of requests the front end finished (stop strings, errors)."""
        self._send(FINISH, [list(item) for item in finishes])

    def has_unfinished(self) -> bool:
        """Whether outputs already received wait to be read (the front end tracks the rest)."""
        return bool(self._pending_outputs)

    def get_stats(self) -> EngineStats:
        """The core's load as of its latest message (read now, without waiting);
        EngineDeadError when this call finds the core gone."""
        if self._dead is None:
            self._check_alive()
            self._poll(0)
        return self._stats

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live requests, asked of the core after every message sent before
        (so an abort sent earlier is counted)."""
        return self._call("num_used_blocks")

    @property
    def prefix_cache_stats(self):
        """Cumulative prefix-cache hits and queries (asks the core)."""
        return self._call("prefix_cache_stats")

    @property
    def step_stats(self):
        """The core's per-step timing totals (asks the core)."""
        return self._call("step_stats")

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash in the core."""
        self._call("reset_prefix_cache")

    # ------------------------------------------------------------------ outputs
    def step(self, timeout_s: float | None = None) -> list[EngineCoreOutput]:
        """The outputs of the core's next step(s) that sent any: waits up to timeout_s (None:
        until some arrive); [] on timeout. EngineDeadError if the core is gone."""
        outs = self._take_pending()
        if outs:
            return outs
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._check_alive()
            wait_ms = LIVENESS_POLL_MS
            if deadline is not None:
                wait_ms = max(0, min(wait_ms, int(1e3 * (deadline - time.monotonic()))))
            self._poll(wait_ms)
            outs = self._take_pending()
            if outs:
                return outs
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _poll(self, wait_ms: int) -> None:
        """Read what arrives within wait_ms into the pending outputs."""
        with self._reading:
            if self._from_core.poll(wait_ms):
                self._pending_outputs.extend(self._read_all())

    def _take_pending(self) -> list[EngineCoreOutput]:
        with self._reading:
            outs, self._pending_outputs = self._pending_outputs, []
        return outs

    def _read_all(self) -> list[EngineCoreOutput]:
        """Every frame waiting now (the caller holds the reading lock): outputs returned,
        replies kept for their callers."""
        outs: list[EngineCoreOutput] = []
        while self._from_core.poll(0):
            kind, payload = unpack(self._from_core.recv())
            if kind == OUTPUTS:
                wire, stats, sent = payload  # sent: the core's time.monotonic() at its step
                for item in wire:
                    out = EngineCoreOutput.from_wire(item)
                    out.timestamp = sent
                    outs.append(out)
                self._stats = EngineStats(*stats)
            elif kind == REPLY:
                call_id, ok, result = payload
                self._replies[call_id] = (ok, result)
            elif kind == FAILED:
                self._dead = f"engine core failed:\n{payload}"
        return outs

    def _call(self, method: str, *call_args):
        """A utility call on the core, answered in order after every message sent before."""
        call_id = next(self._calls)
        self._send(CALL, (call_id, method, list(call_args)))
        while call_id not in self._replies:
            self._check_alive()
            self._poll(LIVENESS_POLL_MS)
        ok, result = self._replies.pop(call_id)
        if not ok:
            raise RuntimeError(pickle.loads(result))
        return pickle.loads(result)

    def _send(self, kind: str, payload) -> None:
        self._check_alive()
        with self._sending:
            self._to_core.send(pack(kind, payload))

    def _check_alive(self) -> None:
        if self._dead is None and self.process.poll() is not None:
            code = self.process.returncode if self._owned else "unknown"
            self._dead = f"engine core process died (exit code {code})"
        if self._dead is not None:
            raise EngineDeadError(self._dead)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Stop the core process (asking first, then terminating, then killing) and close
        the sockets (idempotent); a shared core is left running (its owner stops it)."""
        if not self._owned:
            return self._detach()
        self._stop()
        self._dead = self._dead or "engine core is shut down"

    def _detach(self) -> None:
        """Close the sockets to a shared core, giving the aborts just sent time to leave."""
        self._dead = self._dead or "engine core client is shut down"
        if not self._context.closed:
            self._to_core.close(linger=2000)
            self._from_core.close(linger=0)
            self._context.term()
        self.process.close()


class PeerProcess:
    """A process this one did not start, so cannot wait for: whether it has exited, from a
    pidfd (no pid reuse race). Offers the part of Popen CoreClient uses."""

    returncode: int | None = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = os.pidfd_open(pid)  # ProcessLookupError if already gone

    def poll(self) -> int | None:
        """None while it runs; -1 once it has exited (its exit code is its parent's)."""
        if self.returncode is None and (self._fd is None
                                        or select.select([self._fd], [], [], 0)[0]):
            self.returncode = -1
        return self.returncode

    def close(self) -> None:
        """Stop watching (poll reports it gone after this)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def start_core_process(args: EngineArgs, spec: WorkerSpec, eos_token_ids: tuple[int, ...],
                       addresses: list[tuple[str, str]],
                       new_session: bool = False) -> subprocess.Popen:
    """Start an engine core process for front ends at these (inbox, outbox) addresses (one
    pair: core_proc; more: core_multi); it reports ready (or why it failed) on each outbox.
    new_session: out of the caller's process group, so a terminal's Ctrl-C reaches only the
    caller, which stops it."""
    module = "core_multi" if len(addresses) > 1 else "core_proc"
    process = core_prestart.take(module, new_session)  # started ahead, else a fresh one
    process.stdin.write(pickle.dumps((args, spec, eos_token_ids, addresses, os.getpid(),
                                      registered_models(), sys.path)))
    process.stdin.close()
    return process


def registered_models() -> dict[str, str]:
    """The model registry as "module:Class" references the core process can import (classes
    defined in a __main__ module cannot cross: register them from a module or a plugin)."""
    from compiled_llm.models import ModelRegistry

    refs = {}
    for arch, model_cls in ModelRegistry.models.items():
        if isinstance(model_cls, str):
            refs[arch] = model_cls
        elif model_cls.__module__ != "__main__" and "." not in model_cls.__qualname__:
            refs[arch] = f"{model_cls.__module__}:{model_cls.__qualname__}"
    return refs


def _stop_core(process: subprocess.Popen, to_core, from_core, context: zmq.Context,
               directory: str) -> None:
    """Stop an owned core process (asking first, then terminating, then killing), close the
    sockets and remove the sockets' directory (run once, by shutdown or the finalizer)."""
    if process.poll() is None:
        with contextlib.suppress(zmq.ZMQError):
            to_core.send(pack(SHUTDOWN, None), zmq.NOBLOCK)
        _wait(process, SHUTDOWN_WAIT_S)
    if process.poll() is None:
        process.terminate()
        _wait(process, SHUTDOWN_WAIT_S)
    if process.poll() is None:
        process.kill()
        process.wait()
    if not context.closed:
        to_core.close(linger=0)
        from_core.close(linger=0)
        context.term()
    shutil.rmtree(directory, ignore_errors=True)


def _wait(process: subprocess.Popen, seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(seconds)


class _CorePickler(pickle.Pickler):
    """pickle.Pickler refusing functions and classes of __main__: pickled by reference, they
    would not load in the engine core process (its __main__ is another module)."""

    def reducer_override(self, obj):
        """PicklingError for a __main__ function or class; else the default reduction."""
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in __main__, which the "
                                       "engine core process cannot import; define it in a "
                                       "module")
        return NotImplemented


def _dumps_for_core(req: Request) -> bytes:
    buffer = io.BytesIO()
    _CorePickler(buffer, pickle.HIGHEST_PROTOCOL).dump(req)
    return buffer.getvalue()


def _portable(req: Request) -> Request:
    """The request as the core process needs it: no prompt text (the front end keeps it)."""
    req.prompt = None
    return req
