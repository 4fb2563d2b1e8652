"""Scrape the servers' /metrics during a run into samples.parquet (long format)."""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from netgain.contract.records import sample_schema

log = logging.getLogger("netgain.loadgen")

# Sample names (a counter's with its _total). CPU and kernel time are counters, kept as scraped:
# the report derives their ratios from the increase between scrapes (analysis/counters.py).
SAMPLED = {
    "netgain_gpu_utilization_ratio",
    "netgain_gpu_sm_active_ratio",
    "netgain_gpu_memory_used_bytes",
    "netgain_gpu_memory_total_bytes",
    "netgain_gpu_power_watts",
    "process_cpu_seconds_total",
    "netgain_thread_cpu_seconds_total",
    "netgain_kernel_busy_seconds_total",
    "netgain_device_instances",
    "netgain_cpu_cores",
    "netgain_queue_depth_requests",
    "netgain_in_flight_requests",
}
KEEP_LABELS = ("role", "gpu")


def parse_samples(text: str, t_s: float, source: str) -> list[tuple[float, str, str, str, float]]:
    rows = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name not in SAMPLED:
                continue
            labels = ",".join(f"{k}={s.labels[k]}" for k in KEEP_LABELS if k in s.labels)
            rows.append((t_s, source, s.name, labels, float(s.value)))
    return rows


SCHEMA = sample_schema()


class Samples:
    """Rows go to ``path`` a row group at a time (every ``flush_rows`` or ``flush_s`` seconds,
    whichever comes first), so an hour-long soak does not hold its samples in the master's
    memory; ``close()`` writes the rest. The time bound matters: rows kept long among the
    short-lived objects of every records message pin the Python allocator's arenas."""

    def __init__(
        self,
        path: str,
        flush_rows: int = 20_000,
        flush_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.clock = clock or time.monotonic
        self._flushed_at = self.clock()
        self.rows: list[tuple[float, str, str, str, float]] = []
        self.written = 0
        self._writer: pq.ParquetWriter | None = None
        self._failed: set[str] = set()

    def scrape(self, url: str, t_s: float, source: str, timeout_s: float = 2.0) -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                text = resp.read().decode()
            self.rows.extend(parse_samples(text, t_s, source))
        except Exception as exc:  # a failed scrape is a gap in the samples, never a failed run
            if url not in self._failed:
                self._failed.add(url)
                log.warning("cannot scrape %s (%s); samples will have gaps", url, exc)
        self._maybe_flush()

    def add(self, t_s: float, source: str, metric: str, value: float, labels: str = "") -> None:
        self.rows.append((t_s, source, metric, labels, value))
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if len(self.rows) >= self.flush_rows or (
            self.rows and self.clock() - self._flushed_at >= self.flush_s
        ):
            self.flush()

    def flush(self) -> None:
        self._flushed_at = self.clock()
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, SCHEMA, compression="zstd")
        if self.rows:
            columns = list(zip(*self.rows, strict=True))
            self._writer.write_table(
                pa.table(
                    {f.name: pa.array(col, type=f.type) for f, col in zip(SCHEMA, columns, strict=True)},
                    schema=SCHEMA,
                )
            )
            self.written += len(self.rows)
            self.rows = []
            pa.default_memory_pool().release_unused()  # as RecordSink.flush does

    def close(self) -> None:
        """Write what is left (an empty file with the schema when nothing was sampled)."""
        self.flush()
        assert self._writer is not None
        self._writer.close()
