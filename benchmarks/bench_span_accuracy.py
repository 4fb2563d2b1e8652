"""Span accuracy: do the phases add up to the server total, and does the kernel span match torch.profiler?

1. Every request of a saturating run: |sum(phases) - total| / total (target: <= 2 %).
2. (cuda) A Profile RPC capture of N batches: each batch's kernel span (CUDA events) against the
   profiler's first-kernel-start to last-kernel-end window of the kernels launched inside that
   batch's range (target: within 5 %). Also printed: the GPU's idle time between the batch's
   host-to-device copy and its first kernel, which the event span holds and the window does not.
Usage: python benchmarks/bench_span_accuracy.py --device cuda [--model image] [--batch 64] [--cuda-graphs]
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


def profiler_windows(trace_path: str) -> dict[int, tuple[float, float]]:
    """batch id → (ms from the first to the last kernel launched inside ``netgain_batch_<id>``,
    ms the GPU sat idle between the end of that batch's host-to-device copy and its first kernel).

    The second is the part of the CUDA-event kernel span no kernel ran in: the start event fires
    when the copy is done, the first kernel starts once the host has launched it."""
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
        if e.get("cat") == "cuda_runtime"
        and ("Launch" in str(e.get("name", "")) or "Memcpy" in str(e.get("name", "")))
    ]
    # A graph launch has many kernels under one correlation id.
    gpu: dict[object, list[tuple[str, float, float]]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy"):
            corr = e.get("args", {}).get("correlation")
            gpu.setdefault(corr, []).append((e["cat"], e["ts"], e["ts"] + e["dur"]))
    out = {}
    for bid, a, b, tid in ranges:
        mine = [g for ts, t, c in launches if a <= ts <= b and t == tid for g in gpu.get(c, ())]
        kernels = [(s, e) for cat, s, e in mine if cat == "kernel"]
        if not kernels:
            continue
        first = min(s for s, _ in kernels)
        copies = [e for cat, s, e in mine if cat == "gpu_memcpy" and e <= first]
        lead = max(0.0, first - max(copies)) if copies else 0.0
        out[bid] = ((max(e for _, e in kernels) - first) / 1e3, lead / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="image")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--profile-batches", type=int, default=20)
    ap.add_argument("--cuda-graphs", action="store_true", help="serve with --cuda-graphs (fixed shapes)")
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
    if a.cuda_graphs:
        args.append("--cuda-graphs")
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
        pairs = [(kernel_ms[b], w, lead) for b, (w, lead) in windows.items() if b in kernel_ms and w > 0]
        rel = np.asarray([abs(k - w) / w for k, w, _ in pairs])
        # The same, with the GPU's idle time before the first kernel taken off the event span.
        rel_lead = np.asarray([abs(k - lead - w) / w for k, w, lead in pairs])
        for name, errs in (
            ("kernel span vs profiler", rel),
            ("  less idle time before 1st kernel", rel_lead),
        ):
            if errs.size:
                rows.append(
                    [
                        name,
                        errs.size,
                        f"{np.median(errs) * 100:.3f} %",
                        f"{np.percentile(errs, 99) * 100:.3f} %",
                        f"{(errs <= 0.05).mean() * 100:.2f} % (<=5 %)",
                    ]
                )
        if pairs:
            leads = [lead for _, _, lead in pairs]
            print(
                f"GPU idle between copy and first kernel: median {np.median(leads) * 1e3:.0f} us, "
                f"max {max(leads) * 1e3:.0f} us over {len(leads)} batches"
            )
    print(table(rows, ["check", "n", "median error", "p99 error", "share within 2 %"]))


if __name__ == "__main__":
    main()
