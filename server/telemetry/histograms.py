"""Request and phase duration histograms fed a batch of requests at a time.

prometheus_client's ``Histogram.observe`` costs a few microseconds and takes the GIL on
every call; seven of them per request made the recorder the largest part of the server's
instrumentation overhead. Here bucket counts and sums live in numpy arrays, a drained
group of requests is added with one ``searchsorted`` per series, and a ``collect()`` (the
one-method Collector protocol) exports them as ordinary Prometheus histograms, with the
latest request id of each bucket as its OpenMetrics exemplar.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from netgain.contract.phases import PHASES

SERIES = ("total", *PHASES)  # the series, in this order; add() takes indexes into it
ALL = tuple(range(len(SERIES)))
PER_REQUEST = (0, SERIES.index("queue"), SERIES.index("post"))  # the rest are shared by a batch
SHARED = tuple(i for i in ALL if i not in PER_REQUEST)
EXEMPLAR_ID_CHARS = 128 - len("request_id")  # OpenMetrics caps an exemplar's labels at 128 characters


class DurationHistograms:
    """``netgain_request_duration_seconds`` and ``netgain_phase_duration_seconds{phase}``."""

    def __init__(self, labels: dict[str, str], buckets: Sequence[float]) -> None:
        self.labels = dict(labels)
        self.bounds = np.asarray(buckets, dtype=np.float64)
        n = len(self.bounds) + 1  # the last bucket is +Inf
        self.counts = np.zeros((len(SERIES), n), dtype=np.int64)
        self.sums = np.zeros(len(SERIES), dtype=np.float64)
        self.exemplars: list[Exemplar | None] = [None] * n  # on the request histogram
        self._lock = threading.Lock()

    def add(self, seconds: np.ndarray, request_ids: Sequence[str], series: Sequence[int] = ALL) -> None:
        """``seconds``: shape (requests, len(series)); ``series`` are indexes into SERIES, the
        first of them 0 (the total, which carries the exemplars)."""
        if seconds.size == 0:
            return
        idx = np.searchsorted(self.bounds, seconds, side="left")  # first bound >= value: le semantics
        per_series = [np.bincount(idx[:, c], minlength=self.counts.shape[1]) for c in range(len(series))]
        now = time.time()
        # Latest request per bucket of the total: first occurrence in the reversed column.
        buckets, first = np.unique(idx[::-1, 0], return_index=True)
        last = dict(zip(buckets.tolist(), (len(idx) - 1 - first).tolist(), strict=True))
        sums = seconds.sum(axis=0)
        with self._lock:
            for c, s in enumerate(series):
                self.counts[s] += per_series[c]
                self.sums[s] += sums[c]
            for b, i in last.items():
                rid = request_ids[i][:EXEMPLAR_ID_CHARS]
                self.exemplars[b] = Exemplar({"request_id": rid}, float(seconds[i, 0]), now)

    def add_repeated(self, series: Sequence[int], seconds: Sequence[float], count: int) -> None:
        """``count`` requests with the same ``seconds`` in each of ``series`` (a batch's shared
        phases): one bucket lookup per series instead of one per request."""
        if count <= 0:
            return
        idx = np.searchsorted(self.bounds, seconds, side="left")
        with self._lock:
            for s, b, v in zip(series, idx.tolist(), seconds, strict=True):
                self.counts[s, b] += count
                self.sums[s] += v * count

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts = self.counts.cumsum(axis=1)
            sums = self.sums.copy()
            exemplars = list(self.exemplars)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        names, values = list(self.labels), list(self.labels.values())
        total = HistogramMetricFamily(
            "netgain_request_duration_seconds",
            "Server total per request (arrival to response).",
            labels=names,
        )
        buckets: list[Any] = [
            (le, float(c), ex) if ex is not None else (le, float(c))
            for le, c, ex in zip(les, counts[0], exemplars, strict=True)
        ]
        total.add_metric(values, buckets, float(sums[0]))
        yield total
        phases = HistogramMetricFamily(
            "netgain_phase_duration_seconds",
            "Duration of each server phase per request.",
            labels=[*names, "phase"],
        )
        for s, phase in enumerate(SERIES[1:], start=1):
            phases.add_metric(
                [*values, phase],
                [(le, float(c)) for le, c in zip(les, counts[s], strict=True)],
                float(sums[s]),
            )
        yield phases

    def describe(self) -> Iterator[Metric]:
        # Registration checks names against the registry without collecting.
        yield HistogramMetricFamily("netgain_request_duration_seconds", "", labels=list(self.labels))
        yield HistogramMetricFamily("netgain_phase_duration_seconds", "", labels=[*self.labels, "phase"])


class ArrayHistogram:
    """One label-less Prometheus histogram fed a whole array at a time (``observe_many``): one
    ``searchsorted`` per array instead of an ``observe`` call per value. Same bucket semantics
    (a value equal to a bound counts in that bucket) and the same exposition."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: Any = None) -> None:
        self.name = name
        self.documentation = documentation
        bounds = np.asarray(buckets, dtype=np.float64)
        if bounds.size and np.isposinf(bounds[-1]):
            bounds = bounds[:-1]  # +Inf is always added, as prometheus_client does
        if bounds.size == 0 or np.any(np.diff(bounds) <= 0) or not np.all(np.isfinite(bounds)):
            raise ValueError(f"{name}: buckets must be finite and strictly increasing")
        self.bounds = bounds
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self.sum = 0.0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe_many(self, seconds: np.ndarray) -> None:
        seconds = seconds[~np.isnan(seconds)]  # no bucket holds a NaN, and it would poison _sum
        if seconds.size == 0:
            return
        counts = np.bincount(np.searchsorted(self.bounds, seconds, side="left"), minlength=len(self.counts))
        with self._lock:
            self.counts += counts
            self.sum += float(seconds.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative, total = self.counts.cumsum(), self.sum
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        yield HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=[(le, float(c)) for le, c in zip(les, cumulative, strict=True)],
            sum_value=total,
        )

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=[])
