"""Seeded bootstrap intervals, the enough-samples check and the report's per-phase summaries.

Percentiles are ``netgain.stats.quantiles``' (its docstring states the one policy, nearest-rank);
``QUANTILES``, ``rank`` and ``summarize`` are re-exported here for the report's modules.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netgain.stats.quantiles import QUANTILES, median, quantiles, rank, summarize

__all__ = [
    "QUANTILES",
    "bootstrap_quantile",
    "bootstrap_ranks",
    "bootstrap_rate",
    "drift",
    "drift_of",
    "enough_samples",
    "interval",
    "phase_stats",
    "rank",
    "slope",
    "summarize",
    "upper_bound_rank",
]


def phase_stats(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p99, max of one phase (NaNs ignored) via one partition, not a full sort."""
    v = values[~np.isnan(values)]
    n = len(v)
    if not n:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    p50, p90, p99, top = quantiles(v, [0.5, 0.9, 0.99, 1.0])
    return {"mean": float(v.mean()), "p50": p50, "p90": p90, "p99": p99, "max": top, "n": n}


def bootstrap_quantile(sorted_ms: np.ndarray, q: float, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap distribution of the nearest-rank q-quantile, without resampling n values.

    In a resample of n rows drawn with replacement, the k-th smallest drawn index is
    ceil(n * U_(k)) with U_(k) ~ Beta(k, n - k + 1) (order statistic of n uniforms). So the
    resampled quantile is sorted[ceil(n * Beta) - 1]: the same distribution as the textbook
    row bootstrap, in O(draws) instead of O(draws * n).
    """
    idx = bootstrap_ranks(len(sorted_ms), q, draws, rng)
    return np.asarray(sorted_ms[idx], dtype=np.float64) if len(idx) else np.empty(0)


def bootstrap_ranks(n: int, q: float, draws: int, rng: np.random.Generator) -> np.ndarray:
    """The ranks (0-based, in the sorted values) whose values are ``bootstrap_quantile``'s draws."""
    if n == 0 or draws <= 0:
        return np.empty(0, dtype=np.int64)
    k = rank(n, q) + 1
    u = rng.beta(k, n - k + 1, size=draws)
    return np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)


def bootstrap_rate(bin_counts: np.ndarray, bin_s: float, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap of a rate from per-interval counts (1 s bins resampled with replacement)."""
    m = len(bin_counts)
    if m == 0 or draws <= 0 or bin_s <= 0:
        return np.empty(0)
    idx = rng.integers(0, m, size=(draws, m))
    return np.asarray(bin_counts[idx].mean(axis=1) / bin_s, dtype=np.float64)


def interval(draws: np.ndarray, conf: float = 0.95) -> list[float] | None:
    """Percentile interval of a bootstrap distribution, [low, high]."""
    if len(draws) == 0:
        return None
    lo, hi = quantiles(draws, [(1 - conf) / 2, 1 - (1 - conf) / 2])
    return [lo, hi]


def _binom_upper_tail(n: int, p: float) -> tuple[int, np.ndarray]:
    """(lo, tail) with tail[i] = P(S >= lo + i) for S ~ Binomial(n, p); mass below lo is < 1e-30.

    Built from the pmf recurrence in log space, vectorised, so n = 10 million costs milliseconds.
    """
    sd = math.sqrt(n * p * (1 - p))
    lo = max(0, int(n * p - 12 * sd - 10))
    j = np.arange(lo, n + 1, dtype=np.float64)
    log0 = (
        math.lgamma(n + 1)
        - math.lgamma(lo + 1)
        - math.lgamma(n - lo + 1)
        + lo * math.log(p)
        + (n - lo) * math.log1p(-p)
    )
    steps = np.log((n - j[:-1]) / (j[:-1] + 1)) + math.log(p / (1 - p))
    logpmf = np.concatenate([[log0], log0 + np.cumsum(steps)])
    pmf = np.exp(logpmf)
    tail = np.cumsum(pmf[::-1])[::-1]
    return lo, tail


def enough_samples(sorted_ms: np.ndarray, q: float, conf: float = 0.95) -> dict[str, Any]:
    """Can this run bound its q-quantile from above at ``conf`` confidence? (MLPerf early-stopping spirit)

    With S ~ Binomial(n, q) the number of samples below the true quantile, the k-th smallest
    sample is >= the true quantile with probability P(S <= k - 1). The smallest k where that
    reaches ``conf`` gives a one-sided upper bound sorted[k-1]; it exists only when enough
    samples lie above the claimed percentile (n >= 299 for p99, 2995 for p99.9 at 95 %).
    """
    n = len(sorted_ms)
    est_rank = rank(n, q) + 1 if n else 0
    out: dict[str, Any] = {
        "quantile": q,
        "n": n,
        "confidence": conf,
        "samples_above": n - est_rank,
        "enough": False,
        "upper_bound_ms": None,
        "min_samples": math.ceil(math.log(1 - conf) / math.log(q)),
    }
    k = upper_bound_rank(n, q, conf)
    if k is not None:
        out.update(enough=True, upper_bound_ms=float(sorted_ms[k - 1]), upper_bound_rank=k)
    return out


def upper_bound_rank(n: int, q: float, conf: float = 0.95) -> int | None:
    """The 1-based rank k of ``enough_samples``' upper bound on the q-quantile of n values; None
    when even the maximum cannot bound it at ``conf``."""
    if n == 0:
        return None
    lo, tail = _binom_upper_tail(n, q)
    # P(S <= k-1) = 1 - P(S >= k) >= conf  <=>  P(S >= k) <= 1 - conf
    ok = np.nonzero(tail <= 1 - conf)[0]
    ok = ok[lo + ok >= 1]
    if len(ok):
        k = int(lo + ok[0])
        if k <= n:
            return k
    # k would be n + 1: even the maximum cannot bound the quantile at this confidence
    return None


def drift(latency_ms: np.ndarray, scheduled_s: np.ndarray) -> dict[str, Any]:
    """Median latency of the first vs second half of the measured window (in schedule order)."""
    ok = ~np.isnan(latency_ms)
    if ok.sum() < 4:
        return {"first_half_p50_ms": None, "second_half_p50_ms": None, "ratio": None}
    t = scheduled_s[ok]
    lat = latency_ms[ok]
    mid = (t.min() + t.max()) / 2
    a, b = lat[t < mid], lat[t >= mid]
    if not len(a) or not len(b):
        return {"first_half_p50_ms": None, "second_half_p50_ms": None, "ratio": None}
    return drift_of(median(a), median(b))


def drift_of(first_p50: float | None, second_p50: float | None) -> dict[str, Any]:
    """``drift``'s figures from the two halves' medians (None when a half is empty)."""
    if first_p50 is None or second_p50 is None:
        return {"first_half_p50_ms": None, "second_half_p50_ms": None, "ratio": None}
    ratio = second_p50 / first_p50 if first_p50 > 0 else None
    return {"first_half_p50_ms": first_p50, "second_half_p50_ms": second_p50, "ratio": ratio}


def slope(t: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope dy/dt; 0 with fewer than two distinct times."""
    if len(t) < 2 or float(np.ptp(t)) == 0.0:
        return 0.0
    tc = t - t.mean()
    return float((tc * (y - y.mean())).sum() / (tc * tc).sum())
