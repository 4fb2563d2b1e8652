"""Bounded request queue with batch formation by size and by delay.

The delay deadline starts with the *first* request of a batch (as in Triton and
LitServe): a request never waits more than ``max_delay`` for companions, however
long the queue was empty before it. A full queue sheds at once; nothing waits
for room.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The queue holds ``max_requests`` already: shed with RESOURCE_EXHAUSTED."""


class QueueClosed(Exception):
    """The server is draining: no new work is accepted."""


@dataclass(eq=False)
class Pending:
    """One request travelling through the server, and, once done, its result."""

    request_id: str
    inputs: Sequence[Any]
    arrival_ns: int
    deadline_ns: int | None = None
    future: Any = None
    # Result (set by the pipeline; "OK" or a grpc status code name).
    code: str = "OK"
    message: str = ""
    outputs: list[Any] = field(default_factory=list)
    batch_id: int = -1
    batch_size: int = 0
    # Phase durations in ns; "queue" accumulates every wait between stages.
    spans: dict[str, int] = field(default_factory=dict)
    # perf_counter_ns when post-processing of this request's batch started.
    post_start_ns: int = 0
    # The server-timing trailer up to post, formatted off the event loop ("" when not made).
    timing_head: str = ""
    # The client's W3C traceparent, raw (validated off the event loop, server/telemetry/otlp.py).
    traceparent: str = ""
    # (trace id, span id, parent span id or b""), assigned by the recorder thread when traced.
    trace: tuple[bytes, bytes, bytes] | None = None

    @property
    def n_items(self) -> int:
        return max(1, len(self.inputs))

    def fail(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        self.outputs = []


class RequestQueue:
    def __init__(self, max_requests: int, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        if max_requests < 1:
            raise ValueError("max_requests must be at least 1")
        self.max_requests = max_requests
        self._clock = clock
        self._items: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._queued_items = 0
        # The batcher only needs waking when the queue stops being empty or a batch fills up;
        # a wake-up per request would hand the GIL back and forth for nothing.
        self._full_at = 1

    def __len__(self) -> int:
        return len(self._items)

    def put(self, pending: Pending) -> None:
        with self._cond:
            if self._closed:
                raise QueueClosed("server is shutting down")
            if len(self._items) >= self.max_requests:
                raise QueueFull(f"request queue is full ({self.max_requests} requests waiting)")
            self._items.append(pending)
            self._queued_items += pending.n_items
            if len(self._items) == 1 or self._queued_items >= self._full_at:
                self._cond.notify()

    def close(self) -> None:
        """Refuse new requests; ``take_batch`` keeps returning what is queued, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take_batch(self, max_items: int, max_delay_ns: int) -> list[Pending] | None:
        """Block until a batch is ready: ``max_items`` items queued, or ``max_delay_ns`` past the
        first request's arrival. Returns None once closed and empty. A request larger than
        ``max_items`` forms a batch of its own."""
        with self._cond:
            self._full_at = max_items
            while not self._items:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._items[0].arrival_ns + max_delay_ns
            while True:
                now = self._clock()
                if self._queued_items >= max_items or now >= deadline or self._closed:
                    return self._pop(max_items)
                self._cond.wait((deadline - now) / 1e9)

    def _pop(self, max_items: int) -> list[Pending]:
        batch = [self._items.popleft()]
        total = batch[0].n_items
        while self._items and total + self._items[0].n_items <= max_items:
            p = self._items.popleft()
            total += p.n_items
            batch.append(p)
        self._queued_items -= total
        return batch
