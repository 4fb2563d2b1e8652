"""Resource summaries from samples.parquet and the bottleneck kind, with the evidence that decided it.

Rules, first match wins (thresholds are module constants, documented in docs/report.md):
1. ``loadgen-bound``: send-lag p99 > max_send_lag_ms, any dropped request, or a worker's CPU
   >= WORKER_CPU_SATURATED of a core. The run is not valid evidence, so this outranks the rest.
2. ``gpu-bound``: GPU utilization or kernel busy >= DEVICE_BUSY and queue pressure.
3. ``upstream-bound``: device mostly idle (GPU util and kernel busy < DEVICE_IDLE) while a
   pre/post thread, the frontend, or the whole process is saturated, and queue pressure.
4. ``cpu-bound``: a cpu run whose model compute (device + intra-op threads) uses
   >= CORES_SATURATED of the cores
   (or kernel busy >= DEVICE_BUSY with queue pressure).
5. ``unsaturated`` otherwise.
Queue pressure: the queue-depth fit rises by >= QUEUE_RISE requests over the window, or the
mean depth is >= half the server's max_queue_size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from netgain.loadgen.analysis.stats import slope

DEVICE_BUSY = 0.85
DEVICE_IDLE = 0.50
THREAD_SATURATED = 0.90
CORES_SATURATED = 0.80
PROCESS_SATURATED = 0.90
WORKER_CPU_SATURATED = 0.90
QUEUE_RISE = 8.0


def _labels(s: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv) if s else {}


def series(
    samples: pa.Table | None, t0: float, t1: float
) -> dict[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    """metric -> [(labels, t, value)] inside [t0, t1], sources merged per label set."""
    out: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    if samples is None or samples.num_rows == 0:
        return out
    t = samples.column("t_s").to_numpy()
    keep = (t >= t0) & (t <= t1)
    tab = samples.filter(pa.array(keep))
    for metric in pc.unique(tab.column("metric")).to_pylist():
        sub = tab.filter(pc.equal(tab.column("metric"), metric))
        keys = [
            f"{src}|{lab}"
            for src, lab in zip(
                sub.column("source").to_pylist(), sub.column("labels").to_pylist(), strict=True
            )
        ]
        ts, vs = sub.column("t_s").to_numpy(), sub.column("value").to_numpy()
        arr_keys = np.asarray(keys)
        out[metric] = [(k, ts[arr_keys == k], vs[arr_keys == k]) for k in sorted(set(keys))]
    return out


def _mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return float(np.mean(vals)) if vals else None


def _max_mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return max(vals) if vals else None


def summarize_resources(
    ser: dict[str, Any], meta: dict[str, Any], window_s: float
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
    roles: dict[str, list[float]] = {}
    for key, _, v in ser.get("netgain_thread_cpu_ratio", []):
        role = _labels(key.split("|", 1)[1]).get("role", "unknown")
        if len(v):
            roles.setdefault(role, []).append(float(v.mean()))
    # mean per server when several targets were sampled
    n_src = max(1, len({key.split("|", 1)[0] for key, _, _ in ser.get("netgain_thread_cpu_ratio", [])}))
    by_role = {r: float(np.sum(v)) / n_src for r, v in sorted(roles.items())}
    batching = (meta.get("server") or {}).get("batching") or {}
    instances = int(batching.get("instances") or 1)
    threads = {"prepost": max(1, int(batching.get("pre_threads") or 1)) * instances, "frontend": 1}
    cpu: dict[str, Any] = {
        "cores": _max_mean(ser, "netgain_cpu_cores"),
        "process_mean": _mean(ser, "netgain_process_cpu_ratio"),
        "by_role": by_role,
        "per_thread": {r: by_role[r] / threads[r] for r in threads if r in by_role},
        "worker_max": _max_mean(ser, "netgain_client_worker_cpu_ratio"),
    }
    q = ser.get("netgain_queue_depth_requests", [])
    if q:
        t = np.concatenate([s[1] for s in q])
        y = np.concatenate([s[2] for s in q])
        sl = slope(t, y)
        queue: dict[str, Any] = {
            "mean": float(y.mean()),
            "max": float(y.max()),
            "slope_per_s": sl,
            "rise": sl * window_s,
        }
    else:
        queue = {"mean": None, "max": None, "slope_per_s": None, "rise": None}
    cap = batching.get("max_queue_size")
    queue["max_queue_size"] = cap
    queue["pressure"] = bool(
        (queue["rise"] is not None and queue["rise"] >= QUEUE_RISE)
        or (cap and queue["mean"] is not None and queue["mean"] >= cap / 2)
    )
    return gpu, cpu, queue


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def classify(
    gpu: dict,
    cpu: dict,
    queue: dict,
    *,
    device: str,
    send_lag_p99_ms: float | None,
    max_send_lag_ms: float,
    dropped: int,
) -> dict[str, Any]:
    ev: list[str] = []
    worker = cpu.get("worker_max")
    lag_bad = send_lag_p99_ms is not None and send_lag_p99_ms > max_send_lag_ms
    worker_bad = worker is not None and worker >= WORKER_CPU_SATURATED
    ev.append(f"send lag p99 {_fmt(send_lag_p99_ms)} ms vs limit {max_send_lag_ms:g} ms")
    ev.append(f"dropped requests {dropped}")
    ev.append(f"load worker CPU max {_fmt(worker)} core (saturated at {WORKER_CPU_SATURATED})")
    if lag_bad or dropped > 0 or worker_bad:
        return {"kind": "loadgen-bound", "evidence": ev}
    util, busy = gpu.get("utilization_mean"), gpu.get("kernel_busy_mean")
    busiest = max([x for x in (util, busy) if x is not None], default=None)
    on_gpu = device.startswith("cuda") or bool(gpu.get("present"))
    ev.append(
        f"queue depth mean {_fmt(queue.get('mean'))}, rise over window {_fmt(queue.get('rise'))} "
        f"(pressure: {'yes' if queue.get('pressure') else 'no'}, rise >= {QUEUE_RISE:g})"
    )
    ev.append(
        f"device {device}: GPU utilization mean {_fmt(util)}, SM active {_fmt(gpu.get('sm_active_mean'))}, "
        f"kernel busy {_fmt(busy)} (busy >= {DEVICE_BUSY}, idle < {DEVICE_IDLE})"
    )
    pressure = bool(queue.get("pressure"))
    if on_gpu and busiest is not None and busiest >= DEVICE_BUSY and pressure:
        return {"kind": "gpu-bound", "evidence": ev}
    per_thread = cpu.get("per_thread", {})
    cores, proc = cpu.get("cores"), cpu.get("process_mean")
    ev.append(
        f"CPU per thread: prepost {_fmt(per_thread.get('prepost'))}, frontend "
        f"{_fmt(per_thread.get('frontend'))} core (saturated >= {THREAD_SATURATED}); process "
        f"{_fmt(proc)} of {_fmt(cores)} cores"
    )
    saturated = [r for r, v in per_thread.items() if v >= THREAD_SATURATED]
    if cores and proc is not None and proc >= PROCESS_SATURATED * cores:
        saturated.append("process")
    idle = busiest is not None and busiest < DEVICE_IDLE
    if idle and saturated and pressure:
        ev.append(f"saturated while the device idles: {', '.join(saturated)}")
        return {"kind": "upstream-bound", "evidence": ev}
    # Model compute on a CPU run: the device worker thread calling forward plus torch's intra-op
    # (OpenMP) workers, which the server labels "device" and "compute".
    by_role = cpu.get("by_role", {})
    parts = [by_role[r] for r in ("compute", "device") if by_role.get(r) is not None]
    compute = sum(parts) if parts else None
    ev.append(
        f"model compute (device + intra-op threads) {_fmt(compute)} of {_fmt(cores)} cores "
        f"(saturated >= {CORES_SATURATED})"
    )
    if not on_gpu and (
        (compute is not None and cores and compute >= CORES_SATURATED * cores)
        or (busy is not None and busy >= DEVICE_BUSY and pressure)
    ):
        return {"kind": "cpu-bound", "evidence": ev}
    return {"kind": "unsaturated", "evidence": ev}


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
