"""Waiting queues for the scheduling policies: fcfs (arrival order, preempted requests back at
the front) and priority (lower value first, ties by arrival time)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from itertools import count

from compiled_llm.core.request import Request

POLICIES = ("fcfs", "priority")


class FCFSQueue:
    """Arrival order; a preempted request goes back to the front, ahead of later arrivals."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def requeue(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def clear(self) -> None:
        self._q.clear()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    def __contains__(self, req: object) -> bool:
        return req in self._q


class PriorityQueue:
    """(priority, arrival_time) order, vLLM semantics: lower priority value runs earlier."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = count()  # keeps heap entries comparable without comparing requests

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, next(self._seq), req))

    requeue = add  # its key already places a preempted request where it belongs

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap))

    def __contains__(self, req: object) -> bool:
        return any(e[3] is req for e in self._heap)


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {policy!r}")


def victim_key(policy: str):
    """Which running request to preempt first: the newest (fcfs) or the lowest-priority,
    newest among equals (priority); the oldest, most urgent request is never the victim."""
    if policy == "priority":
        return lambda r: (r.priority, r.arrival_time)
    return lambda r: r.arrival_time
