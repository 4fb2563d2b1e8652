"""Off the request path: histogram observations and the span log, drained by one thread.

The gRPC handler only appends finished requests to a deque; this thread turns
them into Prometheus observations (with the request id as exemplar) and span-log
lines. A failure here is logged and never reaches a request.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from netgain.contract.phases import PHASES
from netgain.server.batching.queue import Pending
from netgain.server.telemetry.histograms import PER_REQUEST, SERIES, SHARED
from netgain.server.telemetry.metrics import ServerMetrics
from netgain.server.telemetry.otlp import OtlpExporter, TraceBuilder, parse_traceparent
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")


class SpanLog:
    """JSON lines, one per request; rotates to ``PATH.1`` past ``max_bytes`` (0 = never).

    Each drain is one ``write`` on an O_APPEND descriptor, so the frontend processes of one
    server append whole lines to one file without interleaving; a process that finds the path
    rotated by another reopens it.
    """

    def __init__(self, path: str, max_bytes: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, lines: list[str]) -> None:
        data = "".join(lines).encode("utf-8")
        try:
            if os.stat(self.path).st_ino != os.fstat(self._fd).st_ino:
                os.close(self._fd)
                self._fd = self._open()
        except FileNotFoundError:
            os.close(self._fd)
            self._fd = self._open()
        size = os.fstat(self._fd).st_size
        if self.max_bytes and size + len(data) > self.max_bytes and size > 0:
            os.close(self._fd)
            os.replace(self.path, self.path + ".1")
            self._fd = self._open()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def flush(self) -> None:
        """Nothing is buffered: every write reaches the file."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_PHASE_KEYS = tuple((phase, f'"{phase}_ms":') for phase in PHASES)


def span_line(p: Pending, total_ns: int, arrival_unix_ns: int, pid: int) -> str:
    """A request's span-log line (JSON), formatted directly: a third of json.dumps of a dict's cost,
    on a thread that shares the frontend's interpreter. Milliseconds with six decimals are whole
    nanoseconds, exact below 10^15 ns (a double's 15 digits)."""
    get = p.spans.get
    phases = ",".join([f"{key}{get(phase, 0) / 1e6:.6f}" for phase, key in _PHASE_KEYS])
    return (
        f'{{"id":{json.dumps(p.request_id)},"code":{json.dumps(p.code)},"batch_id":{p.batch_id},'
        f'"batch_size":{p.batch_size},"items":{p.n_items},"arrival_unix_ns":{arrival_unix_ns},'
        f'"total_ms":{total_ns / 1e6:.6f},{phases},"pid":{pid}}}\n'
    )


SHARED_NAMES = tuple(SERIES[s] for s in SHARED)  # the order of SHARED, as span names
# A request's histogram row, packed on the event loop: bytes are not traversed by the garbage collector
# and the drain reads a group of rows as one array, without converting each value.
ROW_NAMES = tuple(SERIES[s] for s in PER_REQUEST + SHARED)  # total, queue, post, pre, h2d, kernel, d2h
_ROW = struct.Struct(f"={len(ROW_NAMES)}q")  # durations are whole nanoseconds
_PER_REQUEST_ROW = struct.Struct(f"={len(PER_REQUEST)}q")


class Recorder:
    def __init__(
        self,
        metrics: ServerMetrics | None,
        span_log: SpanLog | None,
        interval_s: float = 0.05,
        wall_offset_ns: int | None = None,
        per_request_phases: bool = False,
        tracer: TraceBuilder | None = None,
        exporter: OtlpExporter | None = None,
    ) -> None:
        self.metrics = metrics
        # OTLP: spans built here (tracer) and posted by the exporter's own thread; both or neither.
        self.tracer = tracer
        self.exporter = exporter
        # A frontend process sees no batch: each request's row carries every phase, not only its own.
        self.per_request_phases = per_request_phases
        self.columns = PER_REQUEST + SHARED if per_request_phases else PER_REQUEST
        self.span_log = span_log
        self.interval_s = interval_s
        # perf_counter_ns → unix ns, fixed once so span-log arrival times are comparable across requests.
        self.wall_offset_ns = (
            wall_offset_ns if wall_offset_ns is not None else time.time_ns() - time.perf_counter_ns()
        )
        if tracer is not None:
            tracer.wall_offset_ns = self.wall_offset_ns
        # Plain values (ids, durations, codes), not Pending objects, which the GC would traverse till drained.
        self._ids: deque[str | Pending] = deque()
        self._rows: deque[bytes] = deque()  # packed rows of ``columns``
        self._failed: deque[str] = deque()
        self._logged: deque[tuple[Pending, int]] = deque()
        self._batches: deque[tuple[int, int, tuple[int, ...], int]] = deque()
        # Traced requests and batches (only with OTLP): these hold the requests till drained.
        self._traced: deque[tuple[Pending, int]] = deque()
        self._traced_batches: deque[tuple[Sequence[Pending], int, int, int]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netgain-recorder", daemon=True)
        self.kernel_ns_total = 0
        self.pid = os.getpid()  # which process answered: with --workers, one of the frontends

    def start(self) -> None:
        if self.exporter is not None:
            self.exporter.start()
        self._thread.start()

    def request_done(self, p: Pending, total_ns: int) -> None:
        """On the event loop, once per request: appends only (the drain thread does the rest)."""
        if self.metrics is not None:
            if p.code == "OK":
                # Before the row: the drain takes as many as rows. A traced request goes whole, so
                # its exemplar can carry the trace id the drain assigns.
                self._ids.append(p if p.traceparent or self.tracer is not None else p.request_id)
                s = p.spans
                try:
                    if self.per_request_phases:  # in ROW_NAMES order
                        row = _ROW.pack(
                            total_ns, s["queue"], s["post"], s["pre"], s["h2d"], s["kernel"], s["d2h"]
                        )
                    else:  # the batch-wide phases come once per batch, in batch_done
                        row = _PER_REQUEST_ROW.pack(total_ns, s["queue"], s["post"])
                except KeyError:
                    row = self._row_with_zeros(s, total_ns)
                self._rows.append(row)
            else:
                self._failed.append(p.code)
        if self.span_log is not None:
            self._logged.append((p, total_ns))
        if self.tracer is not None:
            self._traced.append((p, total_ns))

    def _row_with_zeros(self, spans: dict[str, int], total_ns: int) -> bytes:
        """The row of a request that never reached some phase: those count 0."""
        values = [spans.get(name, 0) for name in ROW_NAMES[1 : len(self.columns)]]
        return struct.pack(f"={len(self.columns)}q", total_ns, *values)

    def trace_batch(self, requests: Sequence[Pending], size: int, kernel_ns: int) -> None:
        """A batch span only (the device process of --workers: the frontends count the phases)."""
        if self.tracer is not None and requests:
            self._traced_batches.append((requests, size, kernel_ns, time.perf_counter_ns()))

    def batch_done(self, size: int, kernel_ns: int, requests: Sequence[Pending] = ()) -> None:
        """On a post-processing thread, once per batch: ``requests`` are the batch's; the phases
        they share (pre, h2d, kernel, d2h) are observed once, counted for each OK request."""
        if self.tracer is not None and requests:
            self._traced_batches.append((requests, size, kernel_ns, time.perf_counter_ns()))
        if self.metrics is None:
            self._batches.append((size, kernel_ns, (), 0))
            return
        ok = 0
        shared: tuple[int, ...] = ()
        for p in requests:
            if p.code == "OK":
                if not ok:
                    shared = tuple(p.spans.get(SERIES[s], 0) for s in SHARED)
                ok += 1
        self._batches.append((size, kernel_ns, shared, ok))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._drain()
        if self.span_log is not None:
            self.span_log.close()
        if self.exporter is not None:
            self.exporter.stop()

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
            size, kernel_ns, shared, ok = self._batches.popleft()
            self.kernel_ns_total += kernel_ns
            if m is not None:
                m.batch_child.observe(size)
                m.batches_child.inc()
                m.kernel_child.inc(kernel_ns / 1e9)
            if m is not None and ok:
                m.durations.add_repeated(SHARED, [v / 1e9 for v in shared], ok)
        spans: list[Any] = []
        tracer = self.tracer
        if tracer is not None:
            while self._traced_batches:
                requests, size, kernel_ns, end_ns = self._traced_batches.popleft()
                spans.append(tracer.batch_span(requests, size, kernel_ns, end_ns))
        if m is not None:
            # Appenders only add at the other end; ids are appended before rows, so there are
            # at least as many ids as rows taken.
            n = len(self._rows)
            failed = [self._failed.popleft() for _ in range(len(self._failed))]
            for code, count in Counter(failed).items():
                m.requests_with(code).inc(count)
            if n:
                popleft = self._rows.popleft
                rows = b"".join([popleft() for _ in range(n)])
                ids, trace_ids = self._take_ids(n)
                values = np.frombuffer(rows, dtype=np.int64).reshape(n, len(self.columns))
                m.durations.add(values / 1e9, ids, self.columns, trace_ids)
                m.requests_with("OK").inc(n)  # after the histograms: a scrape never counts more
        if self.span_log is not None:
            logged = [self._logged.popleft() for _ in range(len(self._logged))]
            offset, pid = self.wall_offset_ns, self.pid
            lines.extend([span_line(p, total_ns, p.arrival_ns + offset, pid) for p, total_ns in logged])
        if lines and self.span_log is not None:
            self.span_log.write(lines)
            self.span_log.flush()
        if tracer is not None and self.exporter is not None:
            traced = [self._traced.popleft() for _ in range(len(self._traced))]
            for p, total_ns in traced:
                spans.extend(tracer.request_spans(p, total_ns))
            self.exporter.submit(spans)

    def _take_ids(self, n: int) -> tuple[list[str], list[str] | None]:
        """The next ``n`` request ids and, when any is traced, their trace ids in hex ("" for none)."""
        popleft = self._ids.popleft
        taken = [popleft() for _ in range(n)]
        if self.tracer is None:
            try:
                "".join(cast(list[str], taken))  # a TypeError names a traced request (a Pending) among them
            except TypeError:
                pass
            else:  # none traced: the ids as they are
                return cast(list[str], taken), None
        ids: list[str] = []
        trace_ids: list[str] = []
        traced = False
        for x in taken:
            if isinstance(x, str):
                ids.append(x)
                trace_ids.append("")
                continue
            traced = True
            ids.append(x.request_id)
            if self.tracer is not None:
                trace_ids.append(self.tracer.context(x)[0].hex())
            else:
                parsed = parse_traceparent(x.traceparent)
                trace_ids.append(parsed[0].hex() if parsed else "")
        return ids, trace_ids if traced else None
