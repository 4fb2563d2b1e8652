"""Live view of a run: one latency and one send-lag histogram (fixed memory; the progress lines
and the client metrics both read them), the exact SLO and send-lag checks, progress lines."""

from __future__ import annotations

import math
import sys
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge

from netgain.stats.histogram import DURATION_BUCKETS, Histogram, PrometheusHistogram, fine_bounds
from netgain.stats.quantiles import QuantileCheck


def live_bounds(*limits_ms: float | None) -> np.ndarray:
    """Seconds, 1 µs .. 1000 s in buckets at most 1 % wide, with the exported DURATION_BUCKETS
    and the given limits (ms: the SLO, the send-lag limit) among the bounds. A p99 read from them
    is at most 1 % above the exact nearest-rank one, and on the same side of each limit (the
    values and the limit are divided by 1e3 alike, which keeps their order)."""
    extra = [lim / 1e3 for lim in limits_ms if lim is not None and math.isfinite(lim)]
    return fine_bounds(include=[*DURATION_BUCKETS, *extra])


LIVE_BOUNDS = live_bounds()


class ClientMetrics:
    """``netgain_client_*`` metrics served by the master so dashboards show client beside server."""

    def __init__(
        self,
        registry: CollectorRegistry,
        slo_p99_ms: float | None = None,
        max_send_lag_ms: float | None = None,
    ) -> None:
        # Fed a records message at a time (an observe() per record cost the master's loop a
        # Python call per request, ~40,000 a second with eight busy workers), by LiveStats, which
        # reads its live quantiles from the same histograms.
        self.latency = PrometheusHistogram(
            "netgain_client_latency_seconds",
            "Latency of successful requests from the intended send time (coordinated-omission free).",
            DURATION_BUCKETS,
            registry,
            hist=Histogram(live_bounds(slo_p99_ms)),
        )
        self.send_lag = PrometheusHistogram(
            "netgain_client_send_lag_seconds",
            "Actual minus intended send time.",
            DURATION_BUCKETS,
            registry,
            hist=Histogram(live_bounds(max_send_lag_ms)),
        )
        self.requests = Counter(
            "netgain_client_requests", "Requests answered, by status code.", ("code",), registry=registry
        )
        self.dropped = Counter(
            "netgain_client_dropped", "Requests not sent: in-flight cap reached.", registry=registry
        )
        # A counter, not a rate gauge: rate() of it is the target rate, and rate() of
        # netgain_client_requests_total the achieved one (no *_rps gauge beside them).
        self.scheduled = Counter(
            "netgain_client_scheduled_requests",
            "Requests due by the schedule so far (its mean rate times the time elapsed).",
            registry=registry,
        )
        self.in_flight = Gauge(
            "netgain_client_in_flight_requests", "Requests sent and not answered.", registry=registry
        )
        self.workers = Gauge("netgain_client_workers", "Workers connected.", registry=registry)
        self.dropped.inc(0)


class LiveStats:
    """Counts and histograms of the records as they arrive, and the run's exact verdicts.

    ``latency`` (successful measured requests, done - scheduled) and ``lag`` (measured requests
    that were sent, sent - scheduled, early counted as 0) are one ``Histogram`` each, shared with
    the client metrics when there are any; the progress and summary lines read p50/p99 from them.
    The SLO and send-lag verdicts do not: ``QuantileCheck`` counts, in the report's millisecond
    values and on the report's rows, how many are at most the limit, which decides "nearest-rank
    p99 <= limit" exactly as the report's ``slo_held`` and its send-lag validity check do. (The
    limits are also bucket bounds, so a p99 shown falls on its verdict's side of the limit.)
    """

    def __init__(
        self,
        metrics: ClientMetrics | None,
        out: TextIO = sys.stderr,
        slo_p99_ms: float | None = None,
        max_send_lag_ms: float | None = None,
    ) -> None:
        self.metrics = metrics
        self.out = out
        # Given, the metrics were built with the same limits (the master passes both the same).
        self.latency = metrics.latency.hist if metrics else Histogram(live_bounds(slo_p99_ms))
        self.lag = metrics.send_lag.hist if metrics else Histogram(live_bounds(max_send_lag_ms))
        self.slo = QuantileCheck(slo_p99_ms, 0.99) if slo_p99_ms is not None else None
        self.lag_check = QuantileCheck(max_send_lag_ms, 0.99) if max_send_lag_ms is not None else None
        self.sent = 0
        self.ok = 0
        self.errors = 0
        self.dropped = 0
        self.measured = 0  # rows outside the warm-up, any status (the report's measured window)
        self.measured_ok = 0  # of them, status OK
        self.measured_codes: dict[str, int] = {}  # of them, rows by status
        self.in_flight: dict[int, int] = {}
        self.worker_cpu: dict[int, float] = {}
        self._last_sent = 0

    def latency_ms(self, q: float) -> float:
        """Live q-quantile of latency (nearest-rank bucket, at most 1 % high); NaN before any."""
        return self.latency.quantile(q) * 1e3

    def lag_ms(self, q: float) -> float:
        return self.lag.quantile(q) * 1e3

    def add(self, batch: pa.RecordBatch) -> None:
        """One batch of records (the records schema of ``netgain.contract.records``)."""

        def ints(name: str) -> np.ndarray:
            return pc.fill_null(batch.column(name), -1).to_numpy(zero_copy_only=False)

        def flags(arr: pa.Array) -> np.ndarray:
            return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)

        sched, sent, done = ints("scheduled_ns"), ints("sent_ns"), ints("done_ns")
        # Answered means a done time, whatever its sign: times are relative to the epoch.
        done_col, status = batch.column("done_ns"), batch.column("status")
        answered = done_col.is_valid().to_numpy(zero_copy_only=False)
        was_sent = batch.column("sent_ns").is_valid().to_numpy(zero_copy_only=False)
        measured, is_ok = ~flags(batch.column("warmup")), flags(pc.equal(status, "OK"))
        # The report's rows and values: OK measured requests with a done time, and measured
        # requests with a sent time, in float64 ms from the integer-ns difference.
        ok_rows, lag_rows = measured & is_ok & answered, measured & was_sent
        lat_ms = (done - sched)[ok_rows].astype(np.float64) / 1e6
        lag_ms = (sent - sched)[lag_rows].astype(np.float64) / 1e6
        self.latency.add(lat_ms / 1e3)
        self.lag.add(np.maximum(lag_ms, 0.0) / 1e3)  # early by clock noise counts as on time
        if self.slo is not None:
            self.slo.add(lat_ms)
        if self.lag_check is not None:
            self.lag_check.add(lag_ms)
        self.measured += int(measured.sum())
        self.measured_ok += int((measured & is_ok).sum())
        measured_status = status if measured.all() else status.filter(pa.array(measured))
        for c in measured_status.value_counts().to_pylist():
            code = str(c["values"])
            self.measured_codes[code] = self.measured_codes.get(code, 0) + int(c["counts"])
        by_code = {c["values"]: int(c["counts"]) for c in status.value_counts().to_pylist()}
        n_ok, n_answered = by_code.get("OK", 0), len(batch) - done_col.null_count
        if done_col.null_count:  # only answered OKs count (the engine writes none without a done time)
            n_ok -= pc.sum(pc.equal(status.filter(pc.is_null(done_col)), "OK")).as_py() or 0
        self.ok += n_ok
        self.dropped += by_code.get("DROPPED", 0)
        self.errors += n_answered - n_ok  # answered and not OK: never negative
        self.sent += n_answered
        m = self.metrics
        if m is not None:  # its latency and send-lag histograms are self.latency and self.lag
            for code, n in by_code.items():
                if code == "DROPPED":
                    m.dropped.inc(n)
                else:
                    m.requests.labels(code=code).inc(n)

    def tick(self, elapsed_s: float, total_s: float, target_rps: float, interval_s: float) -> None:
        achieved = (self.sent - self._last_sent) / max(interval_s, 1e-9)
        self._last_sent = self.sent
        if self.metrics is not None:
            self.metrics.scheduled.inc(max(0.0, target_rps * interval_s))
            self.metrics.in_flight.set(sum(self.in_flight.values()))

        def ms(v: float, width: int) -> str:  # "-" until measured requests (after warm-up) arrive
            return f"{v:{width}.2f}" if v == v else "-".rjust(width)

        line = (
            f"[{elapsed_s:6.1f}s/{total_s:.0f}s] target {target_rps:8.1f}/s achieved {achieved:8.1f}/s | "
            f"p50 {ms(self.latency_ms(0.5), 7)} ms "
            f"p99 {ms(self.latency_ms(0.99), 7)} ms | "
            f"ok {self.ok} errors {self.errors} dropped {self.dropped} | "
            f"send-lag p99 {ms(self.lag_ms(0.99), 6)} ms"
        )
        print(line, file=self.out, flush=True)

    def error_rate(self) -> float | None:
        """Non-OK share of the measured rows, as the report's ``error_rate``."""
        return (self.measured - self.measured_ok) / self.measured if self.measured else None

    def slo_failures(self, max_error_rate: float | None) -> list[str]:
        """Why the run misses its SLO (exit 4), decided as the report's ``slo_held`` is: the
        nearest-rank p99 of successful measured latencies above ``--slo-p99-ms``, or the
        measured error rate above ``max_error_rate``. Empty when it holds."""
        out = []
        if self.slo is not None and self.slo.held() is False:
            out.append(
                f"p99 > SLO {self.slo.limit:g} ms ({self.slo.above()} of {self.slo.n} successful "
                f"requests above it, at most {self.slo.allowed_above()} may be)"
            )
        rate = self.error_rate()
        if max_error_rate is not None and rate is not None and rate > max_error_rate:
            out.append(f"error rate {rate:.4f} > {max_error_rate}")
        return out

    def measured_failures(self) -> str:
        """The measured requests that failed, by status ("" when none did): ``netgain load`` exits 5
        on them unless ``--max-error-rate`` says how many may fail."""
        bad = {k: v for k, v in self.measured_codes.items() if k != "OK"}
        if not bad:
            return ""
        parts = ", ".join(f"{v} {k}" for k, v in sorted(bad.items(), key=lambda kv: -kv[1]))
        return f"{sum(bad.values())} of {self.measured} measured requests failed ({parts})"

    def target_gone(self) -> str:
        """ "TARGET WENT AWAY ..." when a tenth or more of the measured requests were UNAVAILABLE
        (the server died, refused connections or was unreachable), else ""."""
        unavailable = self.measured_codes.get("UNAVAILABLE", 0)
        if not self.measured or unavailable * 10 < self.measured:
            return ""
        return (
            f"TARGET WENT AWAY: {unavailable} of {self.measured} measured requests "
            f"({unavailable / self.measured:.0%}) UNAVAILABLE (server gone, connection refused)"
        )

    def send_lag_exceeded(self) -> bool:
        """Send-lag p99 above ``max_send_lag_ms``, exactly as the report's validity check."""
        return self.lag_check is not None and self.lag_check.held() is False
