"""The one log-bucket histogram: the server's request and phase durations, and the load
generator's live latency and send lag, all count into ``Histogram``.

Bucket counts and sums live in numpy arrays (one row per series) and a whole array of values
is added with one ``searchsorted``: prometheus_client's ``observe`` costs microseconds and takes
the GIL per value. Buckets have Prometheus ``le`` semantics (a value equal to a bound counts in
that bound's bucket; one more bucket above the last bound is +Inf).

``quantile`` applies the nearest-rank policy of ``netgain.stats.quantiles`` to the counts: it
finds the bucket holding the rank-th value and returns that bucket's upper bound. That is never
below the exact nearest-rank quantile and at most one bucket width above it: with ``fine_bounds``
(buckets at most 1 % wide) within 1 %. ``PrometheusHistogram`` exports one histogram at a subset
of its bounds (the usual ``DURATION_BUCKETS``), so one set of counts serves both the exact-enough
live quantiles and the dashboards.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from netgain.stats.quantiles import rank


def log_buckets(lo: float = 1e-5, hi: float = 10.0, per_decade: int = 4) -> tuple[float, ...]:
    """Log-spaced histogram bounds from ``lo`` to ``hi`` seconds (10 µs .. 10 s by default)."""
    out: list[float] = []
    v = lo
    step = 10 ** (1 / per_decade)
    while v <= hi * 1.0001:
        out.append(float(f"{v:.3g}"))
        v *= step
    return tuple(out)


DURATION_BUCKETS = log_buckets()  # the exported buckets of every netgain duration histogram


def fine_bounds(
    lo: float = 1e-6, hi: float = 1e3, growth: float = 1.01, include: Sequence[float] = ()
) -> np.ndarray:
    """Bounds ``lo * growth**k`` up to ``hi`` (1 µs .. 1000 s, 1 % apart by default) merged with
    ``include`` (bounds to export exactly): every bucket in [lo, hi] is at most ``growth`` wide."""
    k = math.ceil(math.log(hi / lo) / math.log(growth))
    grid = lo * growth ** np.arange(k + 1, dtype=np.float64)
    return np.unique(np.concatenate([grid, np.asarray(include, dtype=np.float64)]))


def _check_bounds(bounds: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    b = np.asarray(bounds, dtype=np.float64)
    if b.size and np.isposinf(b[-1]):
        b = b[:-1]  # +Inf is always the last bucket, as prometheus_client adds it
    if b.size == 0 or np.any(np.diff(b) <= 0) or not np.all(np.isfinite(b)):
        raise ValueError(f"{what}: buckets must be finite and strictly increasing")
    return b


class Histogram:
    """Counts per bucket (``le`` bounds plus +Inf) and sums, for one or more series.

    Adds are vectorised and thread-safe (``lock``, re-entrant, also held by exporters that read
    counts together with state of their own)."""

    def __init__(
        self, bounds: Sequence[float] | np.ndarray, series: int = 1, name: str = "histogram"
    ) -> None:
        self.bounds = _check_bounds(bounds, name)
        self.counts = np.zeros((series, len(self.bounds) + 1), dtype=np.int64)
        self.sums = np.zeros(series, dtype=np.float64)
        self.lock = threading.RLock()
        self._series_offsets: dict[tuple[int, ...], np.ndarray] = {}  # add_rows's, per series tuple

    @property
    def total(self) -> int:
        """Values counted in series 0."""
        return self.count(0)

    def count(self, series: int = 0) -> int:
        return int(self.counts[series].sum())

    @property
    def max_ratio(self) -> float:
        """Widest bucket, as upper over lower bound (between positive bounds): how far above the
        exact quantile ``quantile`` can read, as a factor."""
        b = self.bounds[self.bounds > 0]
        return float((b[1:] / b[:-1]).max()) if b.size > 1 else math.inf

    def add(self, values: np.ndarray, series: int = 0) -> None:
        """One array of values into one series; NaNs are dropped (no bucket holds one, and it
        would poison the sum)."""
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        if v.size == 0:
            return
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=self.counts.shape[1])
        total = float(v.sum())
        with self.lock:
            self.counts[series] += counts
            self.sums[series] += total

    def add_rows(self, values: np.ndarray, series: Sequence[int]) -> np.ndarray:
        """``values`` of shape (n, len(series)), column c into series ``series[c]`` (no NaNs);
        returns each value's bucket index, same shape."""
        idx = np.searchsorted(self.bounds, values, side="left")  # first bound >= value: le semantics
        # One bincount over every series: series s's buckets are offset by s rows of the counts.
        counts = np.bincount((idx + self._offsets(series)).ravel(), minlength=self.counts.size)
        sums = np.bincount(series, weights=values.sum(axis=0), minlength=len(self.sums))
        with self.lock:
            self.counts += counts.reshape(self.counts.shape)
            self.sums += sums
        return idx

    def _offsets(self, series: Sequence[int]) -> np.ndarray:
        key = tuple(series)
        offsets = self._series_offsets.get(key)
        if offsets is None:
            offsets = self._series_offsets[key] = np.asarray(key, dtype=np.int64) * self.counts.shape[1]
        return offsets

    def add_repeated(self, series: Sequence[int], values: Sequence[float], count: int) -> None:
        """``count`` values equal to ``values[c]`` into each ``series[c]``: one bucket lookup per
        series instead of one per value."""
        if count <= 0:
            return
        idx = np.searchsorted(self.bounds, values, side="left")
        with self.lock:
            for s, b, v in zip(series, idx.tolist(), values, strict=True):
                self.counts[s, b] += count
                self.sums[s] += v * count

    def quantile(self, q: float, series: int = 0) -> float:
        """Upper bound of the bucket that holds the nearest-rank q-quantile (q a fraction): at or
        above the exact quantile by at most one bucket; +Inf past the last bound, NaN if empty."""
        with self.lock:
            cum = np.cumsum(self.counts[series])
        n = int(cum[-1])
        if n == 0:
            return math.nan
        b = int(np.searchsorted(cum, rank(n, q) + 1, side="left"))
        return float(self.bounds[b]) if b < len(self.bounds) else math.inf

    def index_of(self, at: Sequence[float] | np.ndarray) -> np.ndarray:
        """Positions of the bounds ``at`` (each must be one of this histogram's bounds)."""
        a = np.asarray(at, dtype=np.float64)
        idx = np.searchsorted(self.bounds, a)
        if np.any(idx >= len(self.bounds)) or np.any(self.bounds[np.minimum(idx, len(self.bounds) - 1)] != a):
            raise ValueError("exported buckets must be bounds of the histogram")
        return idx

    def exposition(
        self, at: np.ndarray | None = None, series: Sequence[int] = (0,)
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(``le`` labels, cumulative counts of shape (len(series), len(labels)), sums) at the
        bound positions ``at`` (all bounds when None), +Inf last."""
        with self.lock:
            counts = self.counts[list(series)].copy()
            sums = self.sums[list(series)].copy()
        cum = counts.cumsum(axis=1)
        if at is None:
            les = [floatToGoString(b) for b in self.bounds]
            return [*les, "+Inf"], cum, sums
        les = [floatToGoString(b) for b in self.bounds[at]]
        return [*les, "+Inf"], np.concatenate([cum[:, at], cum[:, -1:]], axis=1), sums


class PrometheusHistogram:
    """One label-less Prometheus histogram over a ``Histogram`` (a Collector: register it). It
    exports ``buckets``, which must be bounds of ``hist``; by default ``hist`` has exactly those.
    ``observe_many`` adds an array (seconds) at once. Same bucket semantics and exposition as
    prometheus_client's ``Histogram``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: Any = None,
        hist: Histogram | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = _check_bounds(buckets, name)
        self.hist = hist if hist is not None else Histogram(self.bounds, name=name)
        self._at = self.hist.index_of(self.bounds)
        if registry is not None:
            registry.register(self)

    def observe_many(self, seconds: np.ndarray) -> None:
        self.hist.add(seconds)

    def collect(self) -> Iterator[Metric]:
        les, cum, sums = self.hist.exposition(self._at)
        yield HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=[(le, float(c)) for le, c in zip(les, cum[0], strict=True)],
            sum_value=float(sums[0]),
        )

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=[])
