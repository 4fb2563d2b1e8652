"""Ratios from the counters a run scraped: what the report reads as a utilisation series.

The server exports CPU and kernel time as counters (``process_cpu_seconds_total``,
``netgain_thread_cpu_seconds_total{role}``, ``netgain_kernel_busy_seconds_total``, with
``netgain_device_instances``), not as ratio gauges; samples.parquet keeps them as scraped. The
report's ``cpu``/``gpu`` sections read a ratio series per metric, so each counter becomes one,
the increase between two consecutive scrapes of a source over the time between them (a counter
that fell was reset, as Prometheus's ``rate()`` takes it: the increase is its new value), under
the name of the gauge it replaced. Runs recorded before the change carry those gauges already and
pass through as they are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from netgain.analysis import sample_arrays
from netgain.analysis.sample_arrays import SampleArrays

# counter -> the ratio series it yields (1.0 = one core, or one instance always busy)
RATIOS = {
    "process_cpu_seconds_total": "netgain_process_cpu_ratio",
    "netgain_thread_cpu_seconds_total": "netgain_thread_cpu_ratio",
    "netgain_kernel_busy_seconds_total": "netgain_kernel_busy_ratio",
    # the load generator's host (its busy and steal time) and the load generator's own processes
    "netgain_host_cpu_seconds_total": "netgain_host_cpu_ratio",
    "netgain_loadgen_cpu_seconds_total": "netgain_loadgen_cpu_ratio",
}
INSTANCES = "netgain_device_instances"  # the kernel busy ratio is per instance


def increase_rates(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, increase per second) between consecutive readings of one counter, sorted by time."""
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    dt, dv = np.diff(t), np.diff(v)
    dv = np.where(dv < 0, v[1:], dv)  # a reset: counted from zero
    keep = dt > 0
    return t[1:][keep], dv[keep] / dt[keep]


def with_ratios(samples: pa.Table) -> pa.Table:
    """``samples`` with the ratio rows derived from its counters appended (same schema)."""
    arrays = sample_arrays.from_table(samples)
    derived = add_ratios(arrays)
    n = arrays.num_rows
    if derived.num_rows == n:
        return samples
    tail = sample_arrays.SampleArrays(derived.keys, derived.code[n:], derived.t[n:], derived.value[n:])
    return pa.concat_tables([samples, sample_arrays.to_table(tail, samples.schema)])


def add_ratios(s: SampleArrays) -> SampleArrays:
    """``s`` with the ratio rows derived from its counters appended: each counter series (in order
    of first appearance) becomes its ratio series, rows sorted by time."""
    is_counter = np.array([k[1] in RATIOS for k in s.keys], dtype=bool)
    is_instances = np.array([k[1] == INSTANCES for k in s.keys], dtype=bool)
    wanted = np.flatnonzero((is_counter | is_instances)[s.code]) if len(s.keys) else np.zeros(0, np.int64)
    if not len(wanted):
        return s
    code = s.code[wanted]
    order = np.argsort(code, kind="stable")  # each series' rows together, in file order
    codes, starts = np.unique(code[order], return_index=True)
    ends = [*starts[1:].tolist(), len(order)]
    bounds = dict(zip(codes.tolist(), zip(starts.tolist(), ends, strict=True), strict=True))
    firsts = {c: int(wanted[order[a]]) for c, (a, _) in bounds.items()}
    groups = sorted(bounds, key=firsts.__getitem__)  # order of first appearance

    def rows(c: int) -> np.ndarray:
        a, b = bounds[c]
        return wanted[order[a:b]]

    instances: dict[str | None, float] = {}
    for c in groups:
        if is_instances[c]:
            vals = s.value[rows(c)]
            instances[s.keys[c][0]] = float(np.max(vals)) if len(vals) else 1.0
    keys = list(s.keys)
    index = {k: i for i, k in enumerate(keys)}
    derived: list[tuple[int, np.ndarray, np.ndarray]] = []
    for c in groups:
        source, name, labels = s.keys[c]
        if is_instances[c]:
            continue
        idx = rows(c)
        t, rate = increase_rates(s.t[idx], s.value[idx])
        if name == "netgain_kernel_busy_seconds_total":
            rate = rate / max(1.0, instances.get(source, 1.0))
        key = (source, RATIOS[str(name)], labels)
        if key not in index:
            index[key] = len(keys)
            keys.append(key)
        derived.append((index[key], t, rate))
    n = s.num_rows + sum(len(t) for _, t, _ in derived)
    out = SampleArrays(keys, np.empty(n, np.int32), np.empty(n), np.empty(n))
    at = s.num_rows
    out.code[:at], out.t[:at], out.value[:at] = s.code, s.t, s.value
    for c, t, rate in derived:
        out.code[at : at + len(t)], out.t[at : at + len(t)], out.value[at : at + len(t)] = c, t, rate
        at += len(t)
    return out
