"""The per-request figures a run's report is built from, whichever way the rows were read.

``run_summary`` computes them from the rows in memory; ``stream`` from requests.parquet read in row
groups, in bounded memory. The report, the verdict and the comparisons read only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netgain.analysis.rundir import AnalysisError


@dataclass
class Figures:
    rows: int  # every row of requests.parquet
    warmup: int
    t0: float  # the measured window, seconds since the run epoch
    t1: float
    statuses: dict[str, Any]  # statuses, n_measured, n_ok, errors, dropped, error_rate
    latency: dict[str, Any]  # p50..p999, max, mean of measured successful requests
    p99_draws: np.ndarray
    enough: dict[str, Any]
    send_lag: dict[str, Any]
    service: dict[str, Any]
    throughput: float
    completed: int
    thr_draws: np.ndarray
    phases_ms: dict[str, Any]
    tail: dict[str, Any]
    drift: dict[str, Any]
    batch_size_mean: float | None
    offered: int  # measured rows, any status
    arrival_rate: np.ndarray  # scheduled arrivals per 1 s bin from t = 0
    gaps: list[str]
    latency_cdf: list[list[float]]
    join: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False

    @property
    def dur(self) -> float:
        return max(self.t1 - self.t0, 1e-9)


def _cfg(meta: dict[str, Any]) -> dict[str, Any]:
    return meta.get("config") or {}


def window(meta: dict[str, Any], scheduled_s: np.ndarray, warmup_s: float | None) -> tuple[float, float]:
    """[start, end) of the measured window (s since the epoch): after warm-up, to the schedule's end.

    `netgain load` schedules warmup_s + duration_s seconds (config.duration_s excludes the
    warm-up); trace.duration_s is only the last arrival's time, so it is the fallback.
    """
    cfg, trace = _cfg(meta), meta.get("trace") or {}
    cfg_warm = float(cfg.get("warmup_s") or 0.0)
    start = float(warmup_s) if warmup_s is not None else cfg_warm
    if cfg.get("duration_s"):
        end = cfg_warm + float(cfg["duration_s"])
    elif trace.get("duration_s"):
        end = float(trace["duration_s"])
    else:
        end = float(scheduled_s.max()) if len(scheduled_s) else start
    stop = meta.get("interrupted_at_s")
    if stop is not None:  # a partial run is measured up to its Ctrl-C, not over the schedule it never ran
        end = min(end, float(stop))
        if end <= start:
            raise AnalysisError(
                f"the run was interrupted at {float(stop):.1f} s, within its warm-up ({start:g} s): nothing "
                "was measured; run `netgain load` again"
            )
    if end <= start:
        raise AnalysisError(
            f"the warm-up ({start:g} s) leaves no measured window (the schedule ends at {end:g} s): "
            "lower --warmup-s"
        )
    return start, end


def latency_cdf(lat_sorted: Any) -> list[list[float]]:
    """The chart's latency CDF: at most 300 points of the sorted latencies."""
    n_lat = len(lat_sorted)
    return [[float(i + 1) / max(n_lat, 1), float(lat_sorted[i])] for i in cdf_ranks(n_lat)]


def cdf_ranks(n: int) -> np.ndarray:
    """The ranks the latency CDF shows."""
    return np.linspace(0, n - 1, min(n, 300)).astype(np.int64) if n else np.zeros(0, np.int64)
