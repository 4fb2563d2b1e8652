"""The server's kernel span against torch.profiler's trace of the same batches.

For each ``netgain_batch_<id>`` range of a Profile capture: the window from the forward's first to
last kernel, and the two stretches of the CUDA-event kernel span in which the GPU ran nothing: the
start event fires when the copy in is done, but the first kernel starts only once the host has
launched it; the end event cannot fire before the host records it, so if the GPU finishes the last
kernel first it waits (Kineto puts host and GPU times on one clock). In eager mode both stretches
are inside the span; a large second one means the forward was launch-bound at its end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from netgain.stats.quantiles import median, quantile


@dataclass(frozen=True)
class KernelWindow:
    window_ms: float  # first kernel start → last kernel end, the forward's kernels only
    idle_before_ms: float  # end of the copy in → first kernel start
    idle_after_ms: float  # last kernel end → the host's next event record
    bracketed: bool  # the forward was found between the device stage's event records


def profiler_windows(
    trace_path: str, host_log: dict[int, list[str]] | None = None
) -> dict[int, KernelWindow]:
    """batch id → its ``KernelWindow``, from a Profile capture's Chrome trace.

    ``host_log``, when given, gets for each batch its timeline: what its thread did and what ran
    on the GPU, in µs from the end of the last kernel."""
    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    ranges = [
        (int(e["name"].rsplit("_", 1)[1]), e["ts"], e["ts"] + e["dur"], e.get("tid"))
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("netgain_batch_")
        and e.get("cat") != "gpu_user_annotation"
    ]
    runtime = [
        (e["ts"], e.get("tid"), e.get("args", {}).get("correlation"), str(e.get("name", "")))
        for e in events
        if e.get("cat") == "cuda_runtime"
    ]
    # A graph launch has many kernels under one correlation id.
    gpu: dict[object, list[tuple[str, float, float]]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy"):
            corr = e.get("args", {}).get("correlation")
            name = str(e.get("name"))
            kind = "htod" if "HtoD" in name else "dtoh" if "DtoH" in name else "copy"
            if e["cat"] == "kernel":
                kind = "kernel"
            gpu.setdefault(corr, []).append((kind, e["ts"], e["ts"] + e["dur"]))
    out: dict[int, KernelWindow] = {}
    for bid, a, b, tid in ranges:
        calls = sorted((ts, c, name) for ts, t, c, name in runtime if a <= ts <= b and t == tid)
        launched = [
            (ts, g) for ts, c, name in calls if "Launch" in name or "Memcpy" in name for g in gpu.get(c, ())
        ]
        # The forward runs between the device stage's event records that follow its last copy in
        # and precede its first copy out: kernels launched outside them are not the forward's (a
        # copy out with a dtype change launches one). Other event records (the pinned-memory
        # allocator's) may sit around the copies, so the first and last in that stretch are taken.
        htod = [ts for ts, (kind, _, _) in launched if kind == "htod"]
        lo = max(htod) if htod else a
        dtoh = [ts for ts, (kind, _, _) in launched if kind == "dtoh" and ts > lo]
        hi = min(dtoh) if dtoh else b
        records = [ts for ts, _, name in calls if "EventRecord" in name and lo < ts < hi]
        bracketed = len(records) >= 2
        if bracketed:
            lo, hi = records[0], records[-1]
        kernels = [(ts, s, e) for ts, (kind, s, e) in launched if kind == "kernel" and lo <= ts <= hi]
        if not kernels:
            continue
        first = min(s for _, s, _ in kernels)
        last_launch, _, last_end = max(kernels, key=lambda k: k[2])
        copies = [e for _, (kind, _, e) in launched if kind == "htod" and e <= first]
        lead = max(0.0, first - max(copies)) if copies else 0.0
        after = [ts for ts, _, name in calls if "EventRecord" in name and ts > last_launch]
        tail = max(0.0, min(after) - last_end) if after else 0.0
        out[bid] = KernelWindow((last_end - first) / 1e3, lead / 1e3, tail / 1e3, bracketed)
        if host_log is not None and after:
            mine = {c for _, c, _ in calls}
            lines = [
                (e["ts"], f"{e.get('cat')}: {e.get('name')}"[:70], e.get("dur", 0))
                for e in events
                if e.get("ph") == "X"
                and (
                    (e.get("tid") == tid and a <= e["ts"] <= b)
                    or (
                        e.get("args", {}).get("correlation") in mine
                        and e.get("cat") in ("kernel", "gpu_memcpy")
                    )
                )
            ]
            host_log[bid] = [f"{ts - last_end:+9.1f} us {dur:8.1f} us  {n}" for ts, n, dur in sorted(lines)]
    return out


def kernel_spans(span_log: str, batch_size: int | None = None) -> dict[int, float]:
    """batch id → kernel span (ms) from a server span log: OK rows, of one batch size if given;
    a line still being written is skipped."""
    out: dict[int, float] = {}
    with open(span_log) as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r["code"] == "OK" and (batch_size is None or r["batch_size"] == batch_size):
                out[r["batch_id"]] = r["kernel_ms"]
    return out


def matched(
    windows: dict[int, KernelWindow], kernel_ms: dict[int, float]
) -> list[tuple[float, KernelWindow]]:
    """(kernel span ms, window) for every batch that has both and a window longer than zero."""
    return [(kernel_ms[b], w) for b, w in windows.items() if b in kernel_ms and w.window_ms > 0]


def span_errors(pairs: list[tuple[float, KernelWindow]]) -> dict[str, np.ndarray]:
    """Each kernel span's relative error against its window: as measured, less the GPU's idle
    time before the first kernel, and less both idle stretches."""
    k = np.asarray([span for span, _ in pairs], dtype=np.float64)
    w = np.asarray([win.window_ms for _, win in pairs], dtype=np.float64)
    before = np.asarray([win.idle_before_ms for _, win in pairs], dtype=np.float64)
    after = np.asarray([win.idle_after_ms for _, win in pairs], dtype=np.float64)
    return {
        "span": np.abs(k - w) / w,
        "less_idle_before": np.abs(k - before - w) / w,
        "less_idle": np.abs(k - before - after - w) / w,
    }


def span_check(windows: dict[int, KernelWindow], kernel_ms: dict[int, float]) -> dict[str, Any]:
    """Kernel spans (ms, by batch id) against the windows of the same batches: relative errors,
    also with the idle stretches taken off, and the stretches themselves."""
    pairs = matched(windows, kernel_ms)
    if not pairs:
        return {"batches": 0}
    errors = span_errors(pairs)
    err = errors["span"]
    return {
        "batches": len(pairs),
        "median_error": median(err),
        "p99_error": quantile(err, 0.99),
        "within_5pct": float((err <= 0.05).mean()),
        "median_error_without_idle": median(errors["less_idle"]),
        "window_ms_median": median([w.window_ms for _, w in pairs]),
        "idle_before_first_us_median": median([w.idle_before_ms for _, w in pairs]) * 1e3,
        "idle_after_last_us_median": median([w.idle_after_ms for _, w in pairs]) * 1e3,
        "unbracketed": sum(1 for _, w in pairs if not w.bracketed),
    }
