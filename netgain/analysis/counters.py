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

from collections import defaultdict

import numpy as np
import pyarrow as pa

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
    metric = samples.column("metric").to_pylist()
    wanted = [i for i, m in enumerate(metric) if m in RATIOS or m == INSTANCES]
    if not wanted:
        return samples
    sub = samples.take(pa.array(wanted))
    t_all = sub.column("t_s").to_numpy()
    v_all = sub.column("value").to_numpy()
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(
        zip(
            sub.column("source").to_pylist(),
            sub.column("metric").to_pylist(),
            sub.column("labels").to_pylist(),
            strict=True,
        )
    ):
        groups[key].append(i)
    instances: dict[str, float] = {}
    for (source, name, _), idx in groups.items():
        if name == INSTANCES:
            vals = v_all[idx]
            instances[source] = float(np.max(vals)) if len(vals) else 1.0
    cols: dict[str, list] = {"t_s": [], "source": [], "metric": [], "labels": [], "value": []}
    for (source, name, labels), idx in groups.items():
        if name == INSTANCES:
            continue
        t, rate = increase_rates(t_all[idx], v_all[idx])
        if name == "netgain_kernel_busy_seconds_total":
            rate = rate / max(1.0, instances.get(source, 1.0))
        n = len(t)
        cols["t_s"].extend(t.tolist())
        cols["source"].extend([source] * n)
        cols["metric"].extend([RATIOS[name]] * n)
        cols["labels"].extend([labels] * n)
        cols["value"].extend(rate.tolist())
    derived = pa.table(
        {f.name: pa.array(cols[f.name], type=f.type) for f in samples.schema}, schema=samples.schema
    )
    return pa.concat_tables([samples, derived])
