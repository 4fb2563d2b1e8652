"""One /metrics endpoint for a server of several processes.

Each child process serves its own registry on a loopback port as JSON (``serve_families``: the
collected families, exemplars included; the text formats cost the supervisor ~30 µs a line to
parse again); the supervisor's collector reads them all at scrape time and adds up samples that
carry the same name and labels: counters (CPU seconds of threads and processes included),
histogram buckets and most gauges are totals over the processes. A few gauges are not sums
(``MAX``, ``MIN``: the server started when its first process did); ``_created`` keeps the
earliest time.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample

from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")

# The same cores and the same limit in every process: not a sum.
MAX = {"netgain_cpu_cores", "process_max_fds"}
MIN = {"process_start_time_seconds"}


def families_json(families: Iterable[Metric]) -> bytes:
    """Collected families as JSON: [name, help, type, unit, [[sample, labels, value, timestamp,
    exemplar or null]]], an exemplar as [labels, value, timestamp]."""

    def stamp(t: Any) -> float | None:
        return None if t is None else float(t)

    out = []
    for fam in families:
        samples = []
        for s in fam.samples:
            ex = s.exemplar
            exemplar = None if ex is None else [ex.labels, ex.value, stamp(ex.timestamp)]
            samples.append([s.name, s.labels, s.value, stamp(s.timestamp), exemplar])
        out.append([fam.name, fam.documentation, fam.type, fam.unit, samples])
    return json.dumps(out, separators=(",", ":")).encode()


def families_from_json(data: bytes) -> list[Metric]:
    """The families ``families_json`` wrote."""
    out = []
    for name, documentation, typ, unit, samples in json.loads(data):
        fam = Metric(name, documentation, typ, unit)
        for sname, labels, value, timestamp, ex in samples:
            exemplar = None if ex is None else Exemplar(ex[0], ex[1], ex[2])
            fam.samples.append(Sample(sname, labels, value, timestamp, exemplar))
        out.append(fam)
    return out


def serve_families(registry: Any, host: str = "127.0.0.1") -> tuple[HTTPServer, int]:
    """A child's registry over HTTP as ``families_json`` on ``host``, a free port: (server, port).
    One thread answers in turn: the supervisor is its only client and reads the children in turn."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 5.0  # a connection that sends nothing does not hold the one thread for good

        def do_GET(self) -> None:
            body = families_json(registry.collect())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    def serve() -> None:
        name_os_thread()
        httpd.serve_forever()

    httpd = HTTPServer((host, 0), Handler)
    threading.Thread(target=serve, name="netgain-metrics", daemon=True).start()
    return httpd, int(httpd.server_port)


def scrape(port: int, timeout_s: float = 2.0) -> list[Metric]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=timeout_s) as resp:
        return families_from_json(resp.read())


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
