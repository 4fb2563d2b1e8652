"""Span accuracy: do the phases add up to the server total, and does the kernel span match torch.profiler?

1. Every request of a saturating run: |sum(phases) - total| / total (target: <= 2 %).
2. (cuda) A Profile RPC capture of N batches: each batch's kernel span (CUDA events) against the
   profiler's first-kernel-start to last-kernel-end window of the kernels launched inside that
   batch's range (target: within 5 %).
Usage: python benchmarks/bench_span_accuracy.py --device cuda [--model image] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

import numpy as np
from common import run_clients, table

from loadgen.orchestrate import ServerProcess


def phase_sum_errors(span_log: str) -> np.ndarray:
    errs = []
    with open(span_log) as fh:
        for line in fh:
            r = json.loads(line)
            if r["code"] != "OK" or r["total_ms"] <= 0:
                continue
            s = sum(r[f"{p}_ms"] for p in ("queue", "pre", "h2d", "kernel", "d2h", "post"))
            errs.append(abs(r["total_ms"] - s) / r["total_ms"])
    return np.asarray(errs)


def profiler_windows(trace_path: str) -> dict[int, float]:
    """batch id → ms from the first to the last kernel launched inside ``netgain_batch_<id>``."""
    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    ranges = [
        (int(e["name"].rsplit("_", 1)[1]), e["ts"], e["ts"] + e["dur"], e.get("tid"))
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("netgain_batch_")
        and e.get("cat") != "gpu_user_annotation"
    ]
    launches = [
        (e["ts"], e.get("tid"), e.get("args", {}).get("correlation"))
        for e in events
        if e.get("cat") == "cuda_runtime" and "Launch" in str(e.get("name", ""))
    ]
    kernels = {
        e.get("args", {}).get("correlation"): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "kernel"
    }
    out = {}
    for bid, a, b, tid in ranges:
        spans = [kernels[c] for ts, t, c in launches if a <= ts <= b and t == tid and c in kernels]
        if spans:
            out[bid] = (max(s[1] for s in spans) - min(s[0] for s in spans)) / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="image")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--profile-batches", type=int, default=20)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    span_log = os.path.join(tmp, "spans.jsonl")
    opts = ["size=224"] if a.model == "image" else (["pad=fixed"] if a.model == "text" else [])
    args = [
        "--model",
        a.model,
        "--device",
        a.device,
        "--max-batch-size",
        str(a.batch),
        "--span-log",
        span_log,
        "--profile-dir",
        tmp,
        "--max-queue-size",
        "4096",
        "--pre-threads",
        "8",
    ]
    for o in opts:
        args += ["--handler-option", o]
    rows = []
    with ServerProcess(args) as server:
        server.wait_ready()
        run_clients(
            server.target, a.model, processes=2, concurrency=a.batch, duration=a.duration, options=opts
        )
        profile: dict[str, object] = {}
        if a.device.startswith("cuda"):
            import grpc

            from protos import InferenceStub, pb

            def capture() -> None:
                with grpc.insecure_channel(server.target) as ch:
                    profile["resp"] = InferenceStub(ch).Profile(
                        pb.ProfileRequest(batches=a.profile_batches), timeout=300
                    )

            t = threading.Thread(target=capture)
            t.start()
            time.sleep(0.5)
            # One request of `batch` items at a time (one server batch per request), until the
            # capture has its batches: profiling every thread slows pre-processing down.
            deadline = time.monotonic() + 60.0
            while t.is_alive() and time.monotonic() < deadline:
                run_clients(
                    server.target,
                    a.model,
                    processes=1,
                    concurrency=1,
                    items=a.batch,
                    duration=2.0,
                    warmup=0.0,
                    options=opts,
                )
            t.join(5)
    errs = phase_sum_errors(span_log)
    rows.append(
        [
            "phases vs total",
            len(errs),
            f"{np.median(errs) * 100:.3f} %",
            f"{np.percentile(errs, 99) * 100:.3f} %",
            f"{(errs <= 0.02).mean() * 100:.2f} %",
        ]
    )
    if "resp" in profile:
        resp = profile["resp"]
        windows = profiler_windows(resp.trace_path)  # type: ignore[attr-defined]
        kernel_ms: dict[int, float] = {}
        with open(span_log) as fh:
            for line in fh:
                r = json.loads(line)
                if r["batch_id"] in windows:
                    kernel_ms[r["batch_id"]] = r["kernel_ms"]
        rel = np.asarray([abs(kernel_ms[b] - w) / w for b, w in windows.items() if b in kernel_ms and w > 0])
        if rel.size:
            rows.append(
                [
                    "kernel span vs profiler",
                    rel.size,
                    f"{np.median(rel) * 100:.3f} %",
                    f"{np.percentile(rel, 99) * 100:.3f} %",
                    f"{(rel <= 0.05).mean() * 100:.2f} % (<=5 %)",
                ]
            )
    print(table(rows, ["check", "n", "median error", "p99 error", "share within 2 %"]))


if __name__ == "__main__":
    main()
