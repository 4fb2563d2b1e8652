"""Live view of a run: a fixed-memory latency histogram, client-side Prometheus metrics, progress lines."""

from __future__ import annotations

import math
import sys
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge

from netgain.server.telemetry.histograms import ArrayHistogram
from netgain.server.telemetry.metrics import DURATION_BUCKETS


class LogHistogram:
    """Counts in log-spaced bins (1 % wide, 1 µs .. 1000 s): percentiles within 1 % in fixed memory."""

    LO_NS = 1_000.0
    GROWTH = 1.01

    def __init__(self) -> None:
        self.nbins = int(math.log(1e12 / self.LO_NS) / math.log(self.GROWTH)) + 2
        self.counts = np.zeros(self.nbins, dtype=np.int64)
        self.total = 0

    def add_many(self, values_ns: np.ndarray) -> None:
        if values_ns.size == 0:
            return
        v = np.maximum(values_ns.astype(np.float64), self.LO_NS)
        bins = np.minimum(
            (np.log(v / self.LO_NS) / math.log(self.GROWTH)).astype(np.int64) + 1, self.nbins - 1
        )
        np.add.at(self.counts, bins, 1)
        self.total += int(values_ns.size)

    def percentile_ms(self, q: float) -> float:
        if self.total == 0:
            return float("nan")
        rank = math.ceil(q / 100.0 * self.total)
        b = int(np.searchsorted(np.cumsum(self.counts), max(1, rank)))
        return self.LO_NS * self.GROWTH ** max(0, b) / 1e6


class ClientMetrics:
    """``netgain_client_*`` metrics served by the master so dashboards show client beside server."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Fed a records message at a time: an observe() per record cost the master's loop a
        # Python call per request (~40,000 a second with eight busy workers).
        self.latency = ArrayHistogram(
            "netgain_client_latency_seconds",
            "Latency from the intended send time (coordinated-omission free).",
            DURATION_BUCKETS,
            registry,
        )
        self.send_lag = ArrayHistogram(
            "netgain_client_send_lag_seconds", "Actual minus intended send time.", DURATION_BUCKETS, registry
        )
        self.requests = Counter(
            "netgain_client_requests", "Requests answered, by status code.", ("code",), registry=registry
        )
        self.dropped = Counter(
            "netgain_client_dropped", "Requests not sent: in-flight cap reached.", registry=registry
        )
        self.target_rps = Gauge("netgain_client_target_rps", "Scheduled request rate.", registry=registry)
        self.achieved_rps = Gauge(
            "netgain_client_achieved_rps", "Requests sent per second, last interval.", registry=registry
        )
        self.in_flight = Gauge(
            "netgain_client_in_flight_requests", "Requests sent and not answered.", registry=registry
        )
        self.workers = Gauge("netgain_client_workers", "Workers connected.", registry=registry)
        self.dropped.inc(0)


class LiveStats:
    def __init__(self, metrics: ClientMetrics | None, out: TextIO = sys.stderr) -> None:
        self.metrics = metrics
        self.out = out
        self.latency = LogHistogram()
        self.lag = LogHistogram()
        self.sent = 0
        self.ok = 0
        self.errors = 0
        self.dropped = 0
        self.in_flight: dict[int, int] = {}
        self.worker_cpu: dict[int, float] = {}
        self._last_sent = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """One batch of records (the records schema of ``loadgen.runner.wire``)."""

        def ints(name: str) -> np.ndarray:
            return pc.fill_null(batch.column(name), -1).to_numpy(zero_copy_only=False)

        sched, sent, done = ints("scheduled_ns"), ints("sent_ns"), ints("done_ns")
        # Answered means a done time, whatever its sign: times are relative to the epoch.
        done_col, status = batch.column("done_ns"), batch.column("status")
        answered = done_col.is_valid().to_numpy(zero_copy_only=False)
        measured = answered & ~batch.column("warmup").to_numpy(zero_copy_only=False)
        lat = (done - sched)[measured]
        lag = np.maximum((sent - sched)[measured], 0)  # early by clock noise counts as on time
        self.latency.add_many(lat)
        self.lag.add_many(lag)
        by_code = {c["values"]: int(c["counts"]) for c in status.value_counts().to_pylist()}
        n_ok, n_answered = by_code.get("OK", 0), len(batch) - done_col.null_count
        if done_col.null_count:  # only answered OKs count (the engine writes none without a done time)
            n_ok -= pc.sum(pc.equal(status.filter(pc.is_null(done_col)), "OK")).as_py() or 0
        self.ok += n_ok
        self.dropped += by_code.get("DROPPED", 0)
        self.errors += n_answered - n_ok  # answered and not OK: never negative
        self.sent += n_answered
        m = self.metrics
        if m is not None:
            m.latency.observe_many(lat / 1e9)
            m.send_lag.observe_many(lag / 1e9)
            for code, n in by_code.items():
                if code == "DROPPED":
                    m.dropped.inc(n)
                else:
                    m.requests.labels(code=code).inc(n)

    def tick(self, elapsed_s: float, total_s: float, target_rps: float, interval_s: float) -> None:
        achieved = (self.sent - self._last_sent) / max(interval_s, 1e-9)
        self._last_sent = self.sent
        if self.metrics is not None:
            self.metrics.achieved_rps.set(achieved)
            self.metrics.target_rps.set(target_rps)
            self.metrics.in_flight.set(sum(self.in_flight.values()))

        def ms(v: float, width: int) -> str:  # "-" until measured requests (after warm-up) arrive
            return f"{v:{width}.2f}" if v == v else "-".rjust(width)

        line = (
            f"[{elapsed_s:6.1f}s/{total_s:.0f}s] target {target_rps:8.1f}/s achieved {achieved:8.1f}/s | "
            f"p50 {ms(self.latency.percentile_ms(50), 7)} ms "
            f"p99 {ms(self.latency.percentile_ms(99), 7)} ms | "
            f"ok {self.ok} errors {self.errors} dropped {self.dropped} | "
            f"send-lag p99 {ms(self.lag.percentile_ms(99), 6)} ms"
        )
        print(line, file=self.out, flush=True)
