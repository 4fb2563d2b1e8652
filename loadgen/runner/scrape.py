"""Scrape the servers' /metrics during a run into samples.parquet (long format)."""

from __future__ import annotations

import logging
import urllib.request
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("netgain.loadgen")

SAMPLED = {
    "netgain_gpu_utilization_ratio",
    "netgain_gpu_sm_active_ratio",
    "netgain_gpu_memory_used_bytes",
    "netgain_gpu_memory_total_bytes",
    "netgain_gpu_power_watts",
    "netgain_process_cpu_ratio",
    "netgain_thread_cpu_ratio",
    "netgain_cpu_cores",
    "netgain_queue_depth_requests",
    "netgain_in_flight_requests",
    "netgain_kernel_busy_ratio",
}
KEEP_LABELS = ("role", "gpu")


def parse_samples(text: str, t_s: float, source: str) -> list[tuple[float, str, str, str, float]]:
    rows = []
    for family in text_string_to_metric_families(text):
        if family.name not in SAMPLED:
            continue
        for s in family.samples:
            labels = ",".join(f"{k}={s.labels[k]}" for k in KEEP_LABELS if k in s.labels)
            rows.append((t_s, source, s.name, labels, float(s.value)))
    return rows


class Samples:
    def __init__(self) -> None:
        self.rows: list[tuple[float, str, str, str, float]] = []
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

    def add(self, t_s: float, source: str, metric: str, value: float, labels: str = "") -> None:
        self.rows.append((t_s, source, metric, labels, value))

    def write(self, path: str) -> None:
        cols: dict[str, Any] = {"t_s": [], "source": [], "metric": [], "labels": [], "value": []}
        for row in self.rows:
            for key, v in zip(cols, row, strict=True):
                cols[key].append(v)
        schema = pa.schema(
            [
                ("t_s", pa.float64()),
                ("source", pa.string()),
                ("metric", pa.string()),
                ("labels", pa.string()),
                ("value", pa.float64()),
            ]
        )
        pq.write_table(pa.table(cols, schema=schema), path)
