"""One /metrics endpoint for a server of several processes.

Each child process serves its own registry on a loopback port; the supervisor's collector
reads them all at scrape time (OpenMetrics, so exemplars survive) and adds up samples that
carry the same name and labels: counters (CPU seconds of threads and processes included),
histogram buckets and most gauges are totals over the processes. A few gauges are not sums
(``MAX``, ``MIN``: the server started when its first process did); ``_created`` keeps the
earliest time.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger("netgain.server")

# The same cores and the same limit in every process: not a sum.
MAX = {"netgain_cpu_cores", "process_max_fds"}
MIN = {"process_start_time_seconds"}
ACCEPT = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def scrape(port: int, timeout_s: float = 2.0) -> list[Metric]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        text = resp.read().decode("utf-8")
    return list(text_string_to_metric_families(text))


def merge(sources: Iterable[Iterable[Metric]]) -> list[Metric]:
    families: dict[str, Metric] = {}
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for source in sources:
        for fam in source:
            if fam.name not in families:
                families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                samples[fam.name] = {}
            acc = samples[fam.name]
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = acc.get(key)
                if old is None:
                    acc[key] = s
                    continue
                if s.name.endswith("_created") or fam.name in MIN:
                    value = min(old.value, s.value)
                elif fam.name in MAX or fam.type == "info":
                    value = max(old.value, s.value)
                else:
                    value = old.value + s.value
                exemplar = s.exemplar or old.exemplar
                acc[key] = Sample(s.name, s.labels, value, old.timestamp, exemplar)
    out = []
    for name, fam in families.items():
        fam.samples = list(samples[name].values())
        out.append(fam)
    return out


class MergedCollector:
    """The one-method Collector protocol over this process's registry and the children's ports."""

    def __init__(self, local: Any, ports: Callable[[], list[int]]) -> None:
        self.local = local
        self.ports = ports

    def collect(self) -> Iterator[Metric]:
        sources: list[Iterable[Metric]] = [list(self.local.collect())]
        for port in self.ports():
            try:
                sources.append(scrape(port))
            except Exception as exc:  # a process that just exited: the rest still report
                log.debug("metrics of the process on port %d unavailable: %s", port, exc)
        yield from merge(sources)
