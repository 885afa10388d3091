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
        self._queue: deque[Request] = deque()

    def add(self, req: Request) -> None:
        """Queue a new arrival behind everything waiting."""
        self._queue.append(req)

    def requeue(self, req: Request) -> None:
        """Put a preempted request back at the front."""
        self._queue.appendleft(req)

    def peek(self) -> Request:
        """The request to admit next, left in the queue."""
        return self._queue[0]

    def pop(self) -> Request:
        """Take the request to admit next."""
        return self._queue.popleft()

    def remove(self, req: Request) -> None:
        """Take req out wherever it waits (an abort)."""
        self._queue.remove(req)

    def clear(self) -> None:
        """Drop every waiting request."""
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __contains__(self, req: object) -> bool:
        return req in self._queue


class PriorityQueue:
    """(priority, arrival_time) order, vLLM semantics: lower priority value runs earlier."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = count()  # keeps heap entries comparable without comparing requests

    def add(self, req: Request) -> None:
        """Queue req at its (priority, arrival_time) place."""
        heapq.heappush(self._heap, (req.priority, req.arrival_time, next(self._seq), req))

    requeue = add  # its key already places a preempted request where it belongs

    def peek(self) -> Request:
        """The most urgent request, left in the queue."""
        return self._heap[0][3]

    def pop(self) -> Request:
        """Take the most urgent request."""
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        """Take req out wherever it waits (an abort; O(n))."""
        self._heap = [entry for entry in self._heap if entry[3] is not req]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        """Drop every waiting request."""
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap))

    def __contains__(self, req: object) -> bool:
        return any(entry[3] is req for entry in self._heap)


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    """The waiting queue of a scheduling policy; ValueError naming the field otherwise."""
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {policy!r}")


def victim_key(policy: str):
    """Which running request to preempt first: the newest (fcfs) or the lowest-priority,
    newest among equals (priority); the oldest, most urgent request is never the victim."""
    if policy == "priority":
        return lambda req: (req.priority, req.arrival_time)
    return lambda req: req.arrival_time
