"""Request and phase duration histograms fed a batch of requests at a time.

prometheus_client's ``Histogram.observe`` costs a few microseconds and takes the GIL on
every call; seven of them per request made the recorder the largest part of the server's
instrumentation overhead. The counts live in one ``netgain.stats.histogram.Histogram`` (a
series per phase), a drained group of requests is added with one ``searchsorted`` per series,
and a ``collect()`` (the one-method Collector protocol) exports them as ordinary Prometheus
histograms, with the latest request id of each bucket as its OpenMetrics exemplar.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar

from netgain.contract.phases import PHASES
from netgain.stats.histogram import Histogram

SERIES = ("total", *PHASES)  # the series, in this order; add() takes indexes into it
ALL = tuple(range(len(SERIES)))
PER_REQUEST = (0, SERIES.index("queue"), SERIES.index("post"))  # the rest are shared by a batch
SHARED = tuple(i for i in ALL if i not in PER_REQUEST)
# OpenMetrics caps an exemplar's labels at 128 characters (names and values together): ids longer
# than 118 get no exemplar; a trace id (32 hex digits) rides beside ids of up to 78.
EXEMPLAR_ID_CHARS = 128 - len("request_id")
EXEMPLAR_ID_CHARS_WITH_TRACE = EXEMPLAR_ID_CHARS - len("trace_id") - 32


class DurationHistograms:
    """``netgain_request_duration_seconds`` and ``netgain_phase_duration_seconds{phase}``: one
    ``Histogram`` with a series per entry of SERIES, plus the request histogram's exemplars."""

    def __init__(self, labels: dict[str, str], buckets: Sequence[float]) -> None:
        self.labels = dict(labels)
        self.hist = Histogram(buckets, series=len(SERIES), name="netgain_request_duration_seconds")
        self.exemplars: list[Exemplar | None] = [None] * (len(self.hist.bounds) + 1)  # +Inf last

    def add(
        self,
        seconds: np.ndarray,
        request_ids: Sequence[str],
        series: Sequence[int] = ALL,
        trace_ids: Sequence[str] | None = None,
    ) -> None:
        """``seconds``: shape (requests, len(series)); ``series`` are indexes into SERIES, the
        first of them 0 (the total, which carries the exemplars). ``trace_ids``: each request's
        W3C trace id in hex ("" for none), added to its exemplar when both fit in 128 characters."""
        if seconds.size == 0:
            return
        now = time.time()
        idx = self.hist.add_rows(seconds, series)
        # Latest request per bucket of the total: first occurrence in the reversed column. A
        # request id longer than an exemplar can hold is skipped, never cut: an exemplar's id must
        # equal a request id (the bucket keeps its previous exemplar, or an earlier request's).
        last = self._latest(idx[:, 0], np.arange(len(request_ids), dtype=np.int64))
        if any(
            len(request_ids[i]) > EXEMPLAR_ID_CHARS for i in last.values()
        ):  # look again, over ids that fit
            rows = np.fromiter(
                (i for i, rid in enumerate(request_ids) if len(rid) <= EXEMPLAR_ID_CHARS), dtype=np.int64
            )
            last = self._latest(idx[rows, 0], rows)
        with self.hist.lock:
            for b, i in last.items():
                rid = request_ids[i]
                labels = {"request_id": rid}
                tid = trace_ids[i] if trace_ids is not None else ""
                if tid and len(rid) <= EXEMPLAR_ID_CHARS_WITH_TRACE:
                    labels["trace_id"] = tid
                self.exemplars[b] = Exemplar(labels, float(seconds[i, 0]), now)

    @staticmethod
    def _latest(buckets: np.ndarray, rows: np.ndarray) -> dict[int, int]:
        """Bucket -> the last of ``rows`` in it (``buckets``: each row's bucket, in order)."""
        if rows.size == 0:
            return {}
        found, first = np.unique(buckets[::-1], return_index=True)
        return dict(zip(found.tolist(), rows[::-1][first].tolist(), strict=True))

    def add_repeated(self, series: Sequence[int], seconds: Sequence[float], count: int) -> None:
        """``count`` requests with the same ``seconds`` in each of ``series`` (a batch's shared
        phases): one bucket lookup per series instead of one per request."""
        self.hist.add_repeated(series, seconds, count)

    def collect(self) -> Iterator[Metric]:
        with self.hist.lock:
            les, counts, sums = self.hist.exposition(series=ALL)
            exemplars = list(self.exemplars)
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
