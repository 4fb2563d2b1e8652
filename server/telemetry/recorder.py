"""Off the request path: histogram observations and the span log, drained by one thread.

The gRPC handler only appends finished requests to a deque; this thread turns
them into Prometheus observations (with the request id as exemplar) and span-log
lines. A failure here is logged and never reaches a request.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, deque
from typing import Any, TextIO

import numpy as np

from server.batching.queue import Pending
from server.telemetry.metrics import ServerMetrics
from server.threadnames import name_os_thread
from server.timing import PHASES, phase_values

log = logging.getLogger("netgain.server")


class SpanLog:
    """JSON lines, one per request; rotates to ``PATH.1`` past ``max_bytes`` (0 = never)."""

    def __init__(self, path: str, max_bytes: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._size = self._fh.tell()

    def write(self, lines: list[str]) -> None:
        data = "".join(lines)
        if self.max_bytes and self._size + len(data) > self.max_bytes and self._size > 0:
            self._fh.close()
            os.replace(self.path, self.path + ".1")
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._size = 0
        self._fh.write(data)
        self._size += len(data)

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.flush()
        self._fh.close()


def span_record(p: Pending, total_ns: int, arrival_unix_ns: int) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": p.request_id,
        "code": p.code,
        "batch_id": p.batch_id,
        "batch_size": p.batch_size,
        "items": p.n_items,
        "arrival_unix_ns": arrival_unix_ns,
        "total_ms": round(total_ns / 1e6, 6),
    }
    for phase in PHASES:
        rec[f"{phase}_ms"] = round(p.spans.get(phase, 0) / 1e6, 6)
    return rec


class Recorder:
    def __init__(
        self,
        metrics: ServerMetrics | None,
        span_log: SpanLog | None,
        interval_s: float = 0.05,
        wall_offset_ns: int | None = None,
    ) -> None:
        self.metrics = metrics
        self.span_log = span_log
        self.interval_s = interval_s
        # perf_counter_ns → unix ns, fixed once so span-log arrival times are comparable across requests.
        self.wall_offset_ns = (
            wall_offset_ns if wall_offset_ns is not None else time.time_ns() - time.perf_counter_ns()
        )
        self._done: deque[tuple[Pending, int]] = deque()
        self._batches: deque[tuple[int, int]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netgain-recorder", daemon=True)
        self.kernel_ns_total = 0

    def start(self) -> None:
        self._thread.start()

    def request_done(self, p: Pending, total_ns: int) -> None:
        self._done.append((p, total_ns))

    def batch_done(self, size: int, kernel_ns: int) -> None:
        self._batches.append((size, kernel_ns))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._drain()
        if self.span_log is not None:
            self.span_log.close()

    def _loop(self) -> None:
        name_os_thread()
        while not self._stop.wait(self.interval_s):
            try:
                self._drain()
            except Exception:
                log.exception("telemetry recorder failed; continuing")

    def _drain(self) -> None:
        m = self.metrics
        lines: list[str] = []
        while self._batches:
            size, kernel_ns = self._batches.popleft()
            self.kernel_ns_total += kernel_ns
            if m is not None:
                m.batch_child.observe(size)
                m.batches_child.inc()
                m.kernel_child.inc(kernel_ns / 1e9)
        pop = self._done.popleft
        done = [pop() for _ in range(len(self._done))]  # appenders only add at the other end
        if m is not None and done:
            codes = Counter(p.code for p, _ in done)
            for code, n in codes.items():
                m.requests_with(code).inc(n)
            # One flat list, then one array: building a row list per request cost twice as much.
            flat: list[int] = []
            ids: list[str] = []
            for p, total_ns in done:
                if p.code == "OK":
                    flat.append(total_ns)
                    flat.extend(phase_values(p.spans))
                    ids.append(p.request_id)
            if ids:
                values = np.array(flat, dtype=np.float64).reshape(len(ids), len(PHASES) + 1) / 1e9
                m.durations.add(values, ids)
        if self.span_log is not None:
            for p, total_ns in done:
                rec = span_record(p, total_ns, p.arrival_ns + self.wall_offset_ns)
                lines.append(json.dumps(rec, separators=(",", ":")) + "\n")
        if lines and self.span_log is not None:
            self.span_log.write(lines)
            self.span_log.flush()
