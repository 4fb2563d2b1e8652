"""Describe a trace: rates over time, burstiness, inter-arrival, size and items distributions."""

from __future__ import annotations

from typing import Any

import numpy as np

from netgain.loadgen.traces.model import Trace
from netgain.stats.quantiles import summarize


def _pct(values: np.ndarray, scale: float = 1.0) -> dict[str, float]:
    """p50 p90 p95 p99 p999 (nearest-rank: values the trace has), min, mean, max; {} when empty."""
    if values.shape[0] == 0:
        return {}
    s = np.sort(values.astype(np.float64)) * scale
    out = {k: float(v) for k, v in summarize(s).items() if k != "max" and v is not None}
    out.update(min=float(s[0]), mean=float(values.mean() * scale), max=float(s[-1]))
    return out


def rate_per_bin(trace: Trace, bin_s: float) -> np.ndarray:
    """Requests per second in consecutive bins of ``bin_s`` from offset 0 (the last bin may be partial)."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    if not len(trace):
        return np.zeros(0)
    nb = int(trace.duration_s // bin_s) + 1
    if nb > 10_000_000:
        raise ValueError(f"bin_s={bin_s} makes {nb:,} bins; use a larger bin")
    return np.bincount((trace.t_s // bin_s).astype(np.int64), minlength=nb)[:nb] / bin_s


def inspect_trace(trace: Trace, bin_s: float = 1.0) -> dict[str, Any]:
    """A JSON-ready summary: requests, duration, mean/peak rate, rate per bin, burstiness, percentiles.

    Burstiness: ``cv_interarrival`` (std/mean of gaps: 1 for Poisson, > 1 bursty, 0 constant) and
    ``index_of_dispersion`` (variance/mean of per-bin counts over whole bins: 1 for Poisson).
    """
    n = len(trace)
    rates = rate_per_bin(trace, bin_s)
    gaps = np.diff(trace.t_s)
    whole = int(trace.duration_s // bin_s)
    counts = rates[:whole] * bin_s if whole >= 2 else rates * bin_s
    cv = float(gaps.std() / gaps.mean()) if gaps.shape[0] > 1 and gaps.mean() > 0 else None
    iod = float(counts.var() / counts.mean()) if counts.shape[0] > 1 and counts.mean() > 0 else None
    values, freq = np.unique(trace.items, return_counts=True)
    return {
        "source": trace.source,
        "digest": trace.digest(),
        "requests": n,
        "duration_s": trace.duration_s,
        "mean_rate": trace.mean_rate,
        "peak_rate": float(rates.max()) if rates.shape[0] else 0.0,
        "bin_s": bin_s,
        "rate_per_bin": [float(r) for r in rates],
        "burstiness": {"cv_interarrival": cv, "index_of_dispersion": iod},
        "interarrival_ms": _pct(gaps, 1e3),
        "size_bytes": _pct(trace.size),
        "size_default_fraction": float((trace.size == 0).mean()) if n else 0.0,
        "items": {str(int(v)): int(c) for v, c in zip(values, freq, strict=True)},
        "items_mean": float(trace.items.mean()) if n else 0.0,
        "inputs": int(trace.items.astype(np.int64).sum()),
    }
