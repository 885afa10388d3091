"""The engine core shared by several front ends (`serve --api-server-count N`): one PULL and one
PUSH socket per front end, each request's outputs routed to the front end that sent it. A
front end says hello with its pid; when that process is gone its requests are aborted (their
KV blocks freed) and the core serves the others. It stops on SIGTERM or when its parent dies."""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import zmq

from compiled_llm.config import EngineArgs
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.gc_heap import thaw_heap
from compiled_llm.engine.core_prestart import client_addresses
from compiled_llm.engine.core_proc import (
    ABORT,
    ADD,
    CALL,
    FAILED,
    FINISH,
    GRAMMAR_POLL_MS,
    IDLE_POLL_MS,
    OUTPUTS,
    READY,
    REPLY,
    add_requests,
    build_core,
    call_utility,
    launch,
    pack,
    stats_wire,
    unpack,
)
from compiled_llm.worker.spec import WorkerSpec

__all__ = ["CoreEndpoint", "FrontEnds", "HELLO", "client_addresses", "run_shared_core"]

logger = logging.getLogger(__name__)
HELLO = "hello"  # front end -> core, its first message: its pid
PARENT_POLL_S = 1.0  # how often a core being built checks that its parent still runs
SEND_RETRY_MS = 100  # a front end too slow to take outputs is checked for life this often


@dataclass(frozen=True)
class CoreEndpoint:
    """Where front end `client_index` finds the shared core: the IPC directory the parent
    made, and the core's pid (to notice its death without being its parent)."""

    ipc_dir: str
    client_index: int
    core_pid: int

    @property
    def addresses(self) -> tuple[str, str]:
        """(requests in, outputs out) of this front end."""
        return client_addresses(self.ipc_dir, self.client_index)


class _Stop(Exception):
    """SIGTERM: stop serving (raised by the signal handler, wherever the loop is)."""


def _stop(signum, frame) -> None:
    raise _Stop


def run_shared_core(args: EngineArgs, spec: WorkerSpec, eos_token_ids: tuple[int, ...],
                    addresses: list[tuple[str, str]], parent_pid: int) -> None:
    """The shared core process's main: build the core, report ready (or why not) to every
    front end, serve until SIGTERM or orphaned."""
    signal.signal(signal.SIGTERM, _stop)
    context = zmq.Context()
    fronts = FrontEnds(context, addresses)
    core, built = None, _watch_parent(parent_pid)
    try:
        core = build_core(args, spec, eos_token_ids)
        built.set()  # from here _serve watches the parent
        fronts.broadcast(pack(READY, pickle.dumps((core.info, core.get_stats()))))
        _serve(core, fronts, parent_pid)
    except _Stop:
        logger.info("engine core: stopping (SIGTERM)")
    except BaseException:  # broken or failed to start: say why to every front end
        logger.exception("engine core failed")
        fronts.broadcast(pack(FAILED, traceback.format_exc()))
    finally:
        built.set()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one stops us anywhere
        if core is not None:
            core.shutdown()
        fronts.close()
        context.term()
        thaw_heap()


def _watch_parent(parent_pid: int) -> threading.Event:
    """While the core is built (a model loading): SIGTERM to this process once its parent is
    gone, so a core whose parent died before stopping it does not live on. Set the event
    returned to stop watching."""
    built = threading.Event()

    def watch() -> None:
        while not built.wait(PARENT_POLL_S):
            if os.getppid() != parent_pid:
                logger.error("engine core: its parent is gone while starting; exiting")
                return os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return built


class FrontEnds:
    """The core's side of its front ends: their sockets, which requests each owns (request
    id -> client index), and which are alive. Invariant: every request in `owner` is one
    the core holds, owned by a live front end."""

    def __init__(self, context: zmq.Context, addresses: list[tuple[str, str]]) -> None:
        self.inboxes, self.outboxes = [], []
        self.poller = zmq.Poller()
        for in_addr, out_addr in addresses:
            inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
            inbox.connect(in_addr)
            outbox.connect(out_addr)
            self.poller.register(inbox, zmq.POLLIN)
            self.inboxes.append(inbox)
            self.outboxes.append(outbox)
        self.owner: dict[str, int] = {}
        self.live = [True] * len(addresses)
        self.pidfds: dict[int, int] = {}  # pidfd -> client index, once it said hello
        self.sent_stats: list[tuple | None] = [None] * len(addresses)

    def send(self, client: int, frame: bytes) -> None:
        """Send to a live front end, waiting while it is slow; dropped once it is gone."""
        outbox = self.outboxes[client]
        while self.live[client]:
            try:
                outbox.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                if not outbox.poll(SEND_RETRY_MS, zmq.POLLOUT) and self._exited(client):
                    return

    def broadcast(self, frame: bytes) -> None:
        """Send to every live front end."""
        for client in range(len(self.outboxes)):
            self.send(client, frame)

    def route(self, outputs: list[EngineCoreOutput], stats: tuple) -> None:
        """Each output to its owner (finished ones forgotten); the stats to every live front
        end whose last message had others."""
        wires: dict[int, list] = {}
        owner = self.owner
        for out in outputs:
            client = owner.get(out.request_id)
            if client is None:  # aborted since it was scheduled
                continue
            if out.finish_reason is not None:
                del owner[out.request_id]
            wires.setdefault(client, []).append(out.to_wire())
        for client, live in enumerate(self.live):
            wire = wires.get(client)
            if live and (wire or stats != self.sent_stats[client]):
                self.send(client, pack(OUTPUTS, (wire or [], stats, time.monotonic())))
                self.sent_stats[client] = stats

    def hello(self, client: int, pid: int) -> None:
        """Watch front end `client`'s process from now on."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.live[client] = False
            return
        self.pidfds[fd] = client
        self.poller.register(fd, zmq.POLLIN)

    def _exited(self, client: int) -> bool:
        """Whether front end `client`'s process is gone (never, before its hello)."""
        for fd, index in self.pidfds.items():
            if index == client:
                return bool(select.select([fd], [], [], 0)[0])
        return False

    def gone(self, core, fd: int) -> None:
        """The front end behind pidfd fd exited: abort its requests, stop sending to it."""
        client = self.pidfds.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        self.live[client] = False
        orphans = [rid for rid, index in self.owner.items() if index == client]
        for rid in orphans:
            del self.owner[rid]
        core.abort_requests(orphans)
        logger.warning("engine core: front end %d is gone; aborted its %d requests", client,
                       len(orphans))

    def close(self) -> None:
        """Close every socket and pidfd."""
        for sock in self.inboxes:
            sock.close(linger=0)
        for sock in self.outboxes:
            sock.close(linger=1000)
        for fd in self.pidfds:
            os.close(fd)
        self.pidfds.clear()


def _serve(core, fronts: FrontEnds, parent_pid: int) -> None:
    inbox_of = {sock: client for client, sock in enumerate(fronts.inboxes)}
    while True:
        timeout = 0
        if not core.has_steps():
            timeout = GRAMMAR_POLL_MS if core.has_unfinished() else IDLE_POLL_MS
        events = fronts.poller.poll(timeout)
        if not events and timeout and os.getppid() != parent_pid:
            logger.error("engine core: its parent is gone; exiting")
            return
        for source, _ in events:
            client = inbox_of.get(source)
            if client is None:
                fronts.gone(core, source)
                continue
            inbox = fronts.inboxes[client]
            while inbox.poll(0):
                _handle(core, fronts, client, *unpack(inbox.recv()))
        outputs = core.step() if core.has_unfinished() else []
        fronts.route(outputs, stats_wire(core))


def _handle(core, fronts: FrontEnds, client: int, kind: str, payload) -> None:
    """Apply one message from front end `client`."""
    if not fronts.live[client]:  # read after its process was found gone: nothing to keep
        return
    if kind == ADD:
        for rid in add_requests(core, payload, lambda frame: fronts.send(client, frame)):
            fronts.owner[rid] = client
    elif kind == ABORT:
        _forget(fronts, payload)
        core.abort_requests(payload)
    elif kind == FINISH:
        _forget(fronts, [item[0] for item in payload])
        core.finish_requests(payload)
    elif kind == CALL:
        call_id, method, call_args = payload
        fronts.send(client, pack(REPLY, (call_id, *call_utility(core, method, call_args))))
    elif kind == HELLO:
        fronts.hello(client, payload)


def _forget(fronts: FrontEnds, request_ids: list[str]) -> None:
    for rid in request_ids:
        fronts.owner.pop(rid, None)


def main() -> None:
    """`python -m compiled_llm.engine.core_multi`: the core of several front ends."""
    launch(run_shared_core)


if __name__ == "__main__":
    main()
