"""The kernel-span check against torch.profiler traces: which kernels are the forward's, and the
GPU's idle stretches inside the CUDA-event span. Synthetic Kineto traces, built event by event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from netgain.experiments.kernels import KernelWindow, kernel_spans, profiler_windows, span_check

HTOD = "Memcpy HtoD (Pinned -> Device)"
DTOH = "Memcpy DtoH (Device -> Pinned)"


def event(cat: str, name: str, ts: float, dur: float, tid: int, corr: int | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def host(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return event("cuda_runtime", name, ts, 2, 1, corr)


def record(ts: float, name: str = "cudaEventRecordWithFlags") -> dict[str, Any]:
    return host(ts, 10_000 + int(ts), name)


def gpu(cat: str, name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return event(cat, name, ts, dur, 7, corr)


def batch(bid: int, t0: float = 0.0) -> list[dict[str, Any]]:
    """One device stage in µs from t0: copy in 12-32, kernels 40-70 and 70-90 (launched at 20 and
    30), end event recorded at 120, a dtype-converting kernel and the copy out after it."""
    c = bid * 100
    ev = [
        event("user_annotation", f"netgain_batch_{bid}", t0, 1000, 1),
        record(t0 + 5),
        host(t0 + 10, c + 1, "cudaMemcpyAsync"),
        record(t0 + 16),
        host(t0 + 20, c + 2),
        host(t0 + 30, c + 3),
        record(t0 + 120),
        host(t0 + 125, c + 5),
        host(t0 + 131, c + 6, "cudaMemcpyAsync"),
        record(t0 + 140),
        gpu("gpu_memcpy", HTOD, t0 + 12, 20, c + 1),
        gpu("kernel", "conv", t0 + 40, 30, c + 2),
        gpu("kernel", "gemm", t0 + 70, 20, c + 3),
        gpu("kernel", "to_half", t0 + 130, 10, c + 5),
        gpu("gpu_memcpy", DTOH, t0 + 141, 10, c + 6),
    ]
    return ev


def windows(tmp_path: Path, events: list[dict[str, Any]]) -> dict[int, KernelWindow]:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return profiler_windows(str(path))


def test_forward_is_bracketed_by_the_event_records(tmp_path: Path) -> None:
    w = windows(tmp_path, batch(7))[7]
    # 40 → 90 µs; the copy in ended at 32 (idle 8 µs); the end record came 30 µs after the last
    # kernel; the conversion kernel of the copy out is not the forward's.
    assert (w.window_ms, w.idle_before_ms, w.idle_after_ms) == pytest.approx((0.05, 0.008, 0.03))
    assert w.bracketed


def test_extra_records_and_unsorted_events_do_not_move_the_bracket(tmp_path: Path) -> None:
    events = [*batch(7), record(17, "cudaEventRecord")]  # the pinned-memory allocator's, out of order
    assert windows(tmp_path, list(reversed(events)))[7] == windows(tmp_path, batch(7))[7]


def test_without_records_every_kernel_between_the_copies_counts(tmp_path: Path) -> None:
    w = windows(tmp_path, [e for e in batch(7) if "EventRecord" not in e["name"]])[7]
    assert not w.bracketed and w.window_ms == pytest.approx(0.1)  # 40 → 140, conversion included
    assert w.idle_after_ms == 0.0


def test_graph_launch_kernels_share_one_correlation(tmp_path: Path) -> None:
    events = [
        event("user_annotation", "netgain_batch_3", 0, 500, 1),
        record(5),
        host(10, 1, "cudaMemcpyAsync"),
        record(16),
        host(20, 2, "cudaGraphLaunch"),
        record(60),
        host(65, 6, "cudaMemcpyAsync"),
        gpu("gpu_memcpy", HTOD, 12, 20, 1),
        gpu("kernel", "g1", 33, 20, 2),
        gpu("kernel", "g2", 53, 30, 2),
        gpu("gpu_memcpy", DTOH, 84, 10, 6),
    ]
    w = windows(tmp_path, events)[3]
    assert w.window_ms == pytest.approx(0.05) and w.idle_before_ms == pytest.approx(0.001)
    assert w.idle_after_ms == 0.0


def test_span_check_against_span_log(tmp_path: Path) -> None:
    events = batch(1) + batch(2, t0=5000)
    log = tmp_path / "spans.jsonl"
    rows = [
        {"code": "OK", "batch_id": 1, "batch_size": 8, "kernel_ms": 0.088},  # 0.05 + 8 µs + 30 µs
        {"code": "OK", "batch_id": 2, "batch_size": 4, "kernel_ms": 0.0525},  # 5 % over the window
        {"code": "INVALID_ARGUMENT", "batch_id": 3, "batch_size": 8, "kernel_ms": 9.0},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"code": "OK", "bat')  # torn last line
    assert kernel_spans(str(log)) == {1: 0.088, 2: 0.0525}
    assert kernel_spans(str(log), batch_size=8) == {1: 0.088}
    check = span_check(windows(tmp_path, events), kernel_spans(str(log)))
    assert check["batches"] == 2 and check["unbracketed"] == 0
    assert check["within_5pct"] == 0.5  # batch 2 at exactly 5 %, batch 1 at 76 %
    assert check["median_error"] == pytest.approx(0.05)  # nearest-rank p50 of two: the lower one
    assert check["idle_before_first_us_median"] == pytest.approx(8.0)
    assert check["idle_after_last_us_median"] == pytest.approx(30.0)
    assert span_check({}, {}) == {"batches": 0}
