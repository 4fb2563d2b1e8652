"""Resource summaries over a run's measured window, from samples.parquet: GPU, CPU per thread role
and process, the interpreter per process, queue depth and in-flight requests with their rise, and
the downsampled series the HTML report plots. ``bottleneck`` judges them."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from netgain.analysis import saturation as sat
from netgain.analysis.sample_arrays import SampleArrays
from netgain.analysis.stats import slope

QUEUE_RISE = 8.0
# Thread roles whose CPU time is Python bytecode (it needs the GIL): the event loop and gRPC's
# Python handlers (frontend), pre/post-processing, the batcher, the samplers. The device thread
# and torch's intra-op workers mostly run with the GIL released, gRPC's own threads in C.
INTERPRETER_ROLES = ("frontend", "prepost", "batcher", "telemetry")


def _labels(s: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv) if s else {}


def series(
    samples: SampleArrays | None, t0: float, t1: float
) -> dict[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    """metric -> [(labels, t, value)] inside [t0, t1], sources merged per label set: metrics in
    order of first appearance, each one's ``source|labels`` keys sorted, rows in file order."""
    out: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    if samples is None or samples.num_rows == 0:
        return out
    rows = np.flatnonzero((samples.t >= t0) & (samples.t <= t1))
    code = samples.code[rows]
    order = np.argsort(code, kind="stable")  # each series' rows together, in file order
    codes, starts = np.unique(code[order], return_index=True)
    ends = [*starts[1:].tolist(), len(order)]
    # metric -> its key strings -> the series (codes) under each, metrics by first appearance
    by_metric: dict[Any, dict[str, list[int]]] = {}
    first: dict[Any, int] = {}
    for j, c in enumerate(codes.tolist()):
        source, metric, labels = samples.keys[c]
        by_metric.setdefault(metric, {}).setdefault(f"{source}|{labels}", []).append(j)
        first[metric] = min(first.get(metric, len(rows)), int(order[starts[j]]))
    for metric in sorted(by_metric, key=first.__getitem__):
        if metric is None:  # a null metric name: no series of any use (none is read by name)
            continue
        out[metric] = []
        for key in sorted(by_metric[metric]):
            parts = [order[starts[j] : ends[j]] for j in by_metric[metric][key]]
            pick = rows[np.sort(np.concatenate(parts)) if len(parts) > 1 else parts[0]]
            out[metric].append((key, samples.t[pick], samples.value[pick]))
    return out


def _mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return float(np.mean(vals)) if vals else None


def _max_mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return max(vals) if vals else None


_PID = re.compile(rb"\"pid\":\s*(\d+)")


def requests_by_pid(span_log: str | Path | None) -> dict[str, Any] | None:
    """Requests per server process from the span log's ``pid`` field (a --workers server writes one
    line per request from the frontend that answered it); None without a span log or pids."""
    if span_log is None:
        return None
    counts: Counter[int] = Counter()
    with open(span_log, "rb") as fh:
        for line in fh:
            m = _PID.search(line)
            if m:
                counts[int(m.group(1))] += 1
    return {"requests_by_pid": dict(counts)} if counts else None


def _role_cpu(ser: dict[str, Any]) -> tuple[dict[str, float], int]:
    """CPU cores by thread role over the window (summed over the server's processes, averaged
    over targets), from the ratio gauge or, where the server exports counters of CPU seconds
    (``netgain_thread_cpu_seconds_total``), their rate."""
    roles: dict[str, list[float]] = {}
    sources: set[str] = set()
    for key, _t, v in ser.get("netgain_thread_cpu_ratio", []):
        if len(v):
            roles.setdefault(_labels(key.split("|", 1)[1]).get("role", "unknown"), []).append(float(v.mean()))
            sources.add(key.split("|", 1)[0])
    if not roles:
        for metric in ("netgain_thread_cpu_seconds_total", "netgain_thread_cpu_seconds"):
            for key, t, v in ser.get(metric, []):
                if len(v) >= 2 and t.max() > t.min():
                    rate = (float(v[np.argmax(t)]) - float(v[np.argmin(t)])) / float(t.max() - t.min())
                    roles.setdefault(_labels(key.split("|", 1)[1]).get("role", "unknown"), []).append(
                        max(0.0, rate)
                    )
                    sources.add(key.split("|", 1)[0])
            if roles:
                break
    n_src = max(1, len(sources))
    return {r: float(np.sum(v)) / n_src for r, v in sorted(roles.items())}, n_src


def _rise(series_list: list[tuple[str, np.ndarray, np.ndarray]], window_s: float) -> dict[str, Any]:
    if not series_list:
        return {"mean": None, "max": None, "slope_per_s": None, "rise": None}
    t = np.concatenate([s[1] for s in series_list])
    y = np.concatenate([s[2] for s in series_list])
    sl = slope(t, y)
    return {"mean": float(y.mean()), "max": float(y.max()), "slope_per_s": sl, "rise": sl * window_s}


def interpreter(by_role: dict[str, float], processes: dict[str, Any] | None) -> dict[str, Any]:
    """The interpreter's load: CPU of the interpreter-bound roles summed, per process.

    The metrics endpoint sums a ``--workers`` server's processes. With the span log's ``pid``
    counts, the busiest process's share is the sum times its share of the requests (the work
    follows the requests); without them the sum stands for one process and the figure is
    approximate for a server of several.
    """
    present = [r for r in INTERPRETER_ROLES if r in by_role]
    total = float(sum(by_role[r] for r in present)) if present else None
    out: dict[str, Any] = {
        "roles": present,
        "sum": total,
        "processes": None,
        "busiest_share": None,
        "per_process": total,
        "approximate": True,
        "method": "sum over the server's processes (the span log's pid was not available: "
        "a --workers server is judged approximately)",
    }
    counts = (processes or {}).get("requests_by_pid") or {}
    if counts and total is not None:
        n = sum(counts.values())
        share = max(counts.values()) / n if n else 1.0
        out.update(
            processes=len(counts),
            busiest_share=share,
            per_process=total * share,
            approximate=False,
            method=(
                "one process (span log pid)"
                if len(counts) == 1
                else f"{len(counts)} frontend processes (span log pid): the sum times the busiest "
                f"one's share of the requests ({share:.0%})"
            ),
        )
    return out


def summarize_resources(
    ser: dict[str, Any], meta: dict[str, Any], window_s: float, processes: dict[str, Any] | None = None
) -> tuple[dict, dict, dict]:
    """(gpu, cpu, queue) summaries of the measured window."""
    gpu: dict[str, Any] = {
        "present": "netgain_gpu_utilization_ratio" in ser,
        "utilization_mean": _mean(ser, "netgain_gpu_utilization_ratio"),
        "sm_active_mean": _mean(ser, "netgain_gpu_sm_active_ratio"),
        "kernel_busy_mean": _mean(ser, "netgain_kernel_busy_ratio"),
        "memory_used_max_bytes": None,
        "memory_total_bytes": None,
        "power_mean_watts": _mean(ser, "netgain_gpu_power_watts"),
        "name": (meta.get("versions", {}).get("server") or {}).get("gpu"),
    }
    mem = [float(v.max()) for _, _, v in ser.get("netgain_gpu_memory_used_bytes", []) if len(v)]
    tot = [float(v.max()) for _, _, v in ser.get("netgain_gpu_memory_total_bytes", []) if len(v)]
    gpu["memory_used_max_bytes"] = max(mem) if mem else None
    gpu["memory_total_bytes"] = max(tot) if tot else None
    by_role, _ = _role_cpu(ser)
    batching = (meta.get("server") or {}).get("batching") or {}
    instances = int(batching.get("instances") or 1)
    threads = {"prepost": max(1, int(batching.get("pre_threads") or 1)) * instances, "frontend": 1}
    cpu: dict[str, Any] = {
        "cores": _max_mean(ser, "netgain_cpu_cores"),
        "process_mean": _mean(ser, "netgain_process_cpu_ratio"),
        "by_role": by_role,
        "per_thread": {r: by_role[r] / threads[r] for r in threads if r in by_role},
        "interpreter": interpreter(by_role, processes),
        "worker_max": _max_mean(ser, "netgain_client_worker_cpu_ratio"),
        "host": sat.host_contention(ser, meta),
    }
    queue: dict[str, Any] = _rise(ser.get("netgain_queue_depth_requests", []), window_s)
    queue["in_flight"] = _rise(ser.get("netgain_in_flight_requests", []), window_s)
    cap = batching.get("max_queue_size")
    queue["max_queue_size"] = cap
    in_flight_rise = queue["in_flight"]["rise"]
    queue["pressure"] = bool(
        (queue["rise"] is not None and queue["rise"] >= QUEUE_RISE)
        or (cap and queue["mean"] is not None and queue["mean"] >= cap / 2)
        or (in_flight_rise is not None and in_flight_rise >= QUEUE_RISE)
    )
    return gpu, cpu, queue


def timeseries(ser: dict[str, Any], metrics: tuple[str, ...], max_points: int = 400) -> dict[str, list]:
    """Downsampled ``label -> [[t, v], ...]`` for the HTML plots."""
    out: dict[str, list] = {}
    for metric in metrics:
        for key, t, v in ser.get(metric, []):
            lab = _labels(key.split("|", 1)[1])
            name = metric.removeprefix("netgain_") + (f"[{lab['role']}]" if "role" in lab else "")
            step = max(1, len(t) // max_points)
            order = np.argsort(t)[::step]
            out.setdefault(name, []).extend([[float(t[i]), float(v[i])] for i in order])
    return out
