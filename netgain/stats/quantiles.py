"""Percentiles, the one policy every figure in netgain uses (report, exit code, traces, experiments).

Percentiles use the nearest-rank definition (numpy ``method="inverted_cdf"``): the reported
p99 is a latency some request actually had, the smallest one that at least 99 % of requests
did not exceed. It needs no interpolation and is what MLPerf LoadGen reports. A median is the
p50 under the same rule (with an even count, the lower of the two middle values).

Where the values are not kept, two counts still decide "is the q-quantile at most L?" exactly
(``QuantileCheck``), and ``netgain.stats.histogram.Histogram.quantile`` reads the same rank from
bucket counts (the upper edge of the bucket holding it: at most one bucket width high).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}


def rank(n: int, q: float) -> int:
    """0-based index of the nearest-rank q-quantile in a sorted array of n values."""
    return max(0, min(n - 1, math.ceil(q * n - 1e-9) - 1))


def summarize(sorted_values: np.ndarray) -> dict[str, float | None]:
    """p50..p999 and max of an ascending array (None when empty)."""
    n = len(sorted_values)
    out: dict[str, float | None] = {
        k: (float(sorted_values[rank(n, q)]) if n else None) for k, q in QUANTILES.items()
    }
    out["max"] = float(sorted_values[-1]) if n else None
    return out


def quantiles(values: np.ndarray | Sequence[float], qs: Sequence[float]) -> list[float]:
    """The nearest-rank quantiles ``qs`` (fractions, 0.99 for p99) of unsorted values, NaNs
    ignored, through one partition instead of a sort; NaN for each when no value is left."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    n = len(v)
    if not n:
        return [math.nan] * len(qs)
    ks = [rank(n, q) for q in qs]
    part = np.partition(v, sorted(set(ks)))
    return [float(part[k]) for k in ks]


def quantile(values: np.ndarray | Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (a fraction: 0.99 for p99) of unsorted values, NaNs ignored;
    NaN when no value is left."""
    return quantiles(values, [q])[0]


def median(values: np.ndarray | Sequence[float]) -> float:
    """The nearest-rank p50 (no averaging of the two middle values)."""
    return quantile(values, 0.5)


def quantile_at_most(n: int, at_or_below: int, q: float) -> bool | None:
    """Is the nearest-rank q-quantile of n values at most a limit L, given how many are <= L?

    The quantile is the (rank(n, q) + 1)-th smallest value, so it is <= L exactly when at least
    rank(n, q) + 1 of the values are. None when there are no values (no quantile to judge).
    """
    if n <= 0:
        return None
    return at_or_below >= rank(n, q) + 1


class QuantileCheck:
    """Decides exactly whether the nearest-rank q-quantile of a stream of values is <= ``limit``,
    in fixed memory: it counts the values and those <= ``limit`` (NaNs ignored). The verdict is
    the one ``quantile(all values, q) <= limit`` would give on the same values."""

    def __init__(self, limit: float, q: float) -> None:
        self.limit = float(limit)
        self.q = q
        self.n = 0
        self.at_or_below = 0

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        self.n += int(v.size)
        self.at_or_below += int(np.count_nonzero(v <= self.limit))

    def held(self) -> bool | None:
        """True when the quantile is <= the limit, False when above, None with no values."""
        return quantile_at_most(self.n, self.at_or_below, self.q)

    def above(self) -> int:
        """How many values are above the limit."""
        return self.n - self.at_or_below

    def allowed_above(self) -> int:
        """How many values may lie above the limit with the quantile still <= it."""
        return self.n - (rank(self.n, self.q) + 1) if self.n else 0
