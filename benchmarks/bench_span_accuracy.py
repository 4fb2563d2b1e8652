"""Span accuracy: do the phases add up to the server total, and does the kernel span match torch.profiler?

1. Every request of a saturating run: |sum(phases) - total| / total (target: <= 2 %).
2. (cuda) Profile RPC captures of N batches, one request of --batch items at a time: each
   batch's kernel span (CUDA events) against the profiler's first-kernel-start to last-kernel-end
   window of the kernels launched inside that batch's range (target: within 5 %). Two captures,
   a full one (every operator recorded, as `netgain profile` does) and a ranges-only one (only
   netgain's batch ranges on the host, no per-operator host work). Also printed: the GPU's idle
   time between the batch's host-to-device copy and its first kernel, and between its last kernel
   and the host recording the end event; the event span holds both, the window neither.
3. (cuda) The server's own DeviceRunner in this process, no server around: the same comparison
   under a ranges-only capture, and the unprofiled kernel span against the server's (one batch at
   a time in both).
Usage: python benchmarks/bench_span_accuracy.py --device cuda [--model image] [--batch 64] [--cuda-graphs]
       [--explain] [--serve-args '--intra-op-threads 1']
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import threading
import time
from typing import Any

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


def profiler_windows(
    trace_path: str, host_log: dict[int, list[str]] | None = None
) -> dict[int, tuple[float, float, float, bool]]:
    """batch id → (ms from the first to the last kernel of the forward launched inside
    ``netgain_batch_<id>``, ms the GPU sat idle between the end of that batch's host-to-device copy
    and its first kernel, ms from the end of its last kernel to the host's call recording the next
    CUDA event, whether the forward was bracketed by the device stage's event records).

    The second and third are parts of the CUDA-event kernel span no kernel ran in: the start event
    fires when the copy is done, the first kernel starts once the host has launched it; the end
    event cannot fire before the host records it (Kineto puts host and GPU times on one clock).
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
    out = {}
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
        out[bid] = ((last_end - first) / 1e3, lead / 1e3, tail / 1e3, bracketed)
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


def one_at_a_time(target: str, a: argparse.Namespace, opts: list[str], seconds: float) -> None:
    """One request of ``a.batch`` items at a time: one server batch per request."""
    run_clients(
        target, a.model, processes=1, concurrency=1, items=a.batch, duration=seconds, warmup=0.0, options=opts
    )


def standalone(a: argparse.Namespace, opts: list[str], tmp: str) -> tuple[list[float], dict[int, float], str]:
    """The server's own DeviceRunner in this process, with no server around: kernel spans (ms) of
    unprofiled batches, then of batches under a ranges-only capture, and that capture's trace."""
    import random

    import torch

    from server.batching.pipeline import user_ranges_profiler
    from server.device import DeviceRunner
    from server.handlers import create_handler

    handler = create_handler(a.model, dict(o.split("=", 1) for o in opts), seed=0)
    runner = DeviceRunner(handler, a.device, cuda_graphs=a.cuda_graphs)
    runner.place(handler.build_model())
    rng = random.Random(0)
    items = [handler.preprocess(handler.example_input(rng)) for _ in range(a.batch)]
    batch = runner.prepare(handler.collate(items))
    for _ in range(10):
        runner.run(batch)
    unprofiled = [runner.run(batch).kernel_ns / 1e6 for _ in range(40)]
    spans: dict[int, float] = {}
    prof = user_ranges_profiler(cuda=a.device.startswith("cuda"), experimental_config=None)
    with prof:
        for i in range(a.profile_batches):
            with torch.profiler.record_function(f"netgain_batch_{i}"):
                spans[i] = runner.run(batch).kernel_ns / 1e6
    path = os.path.join(tmp, "standalone-trace.json")
    prof.export_chrome_trace(path)
    return unprofiled, spans, path


def capture(target: str, a: argparse.Namespace, opts: list[str], ranges_only: bool) -> Any:
    """A Profile RPC over ``a.profile_batches`` batches, fed one request of ``a.batch`` items at a
    time (one server batch per request): profiling every thread slows pre-processing down."""
    import grpc

    from protos import InferenceStub, pb

    out: dict[str, object] = {}

    def call() -> None:
        with grpc.insecure_channel(target) as ch:
            try:
                out["resp"] = InferenceStub(ch).Profile(
                    pb.ProfileRequest(batches=a.profile_batches, ranges_only=ranges_only), timeout=300
                )
            except grpc.RpcError as exc:  # reported by the caller, not lost in this thread
                out["resp"] = RuntimeError(f"{exc.code().name}: {exc.details()}")

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)
    deadline = time.monotonic() + 60.0
    while t.is_alive() and time.monotonic() < deadline:
        one_at_a_time(target, a, opts, 2.0)
    t.join(5)
    return out.get("resp")


def span_log_kernels(span_log: str, batch: int) -> dict[int, float]:
    """batch id → kernel span (ms) of every full batch in the span log (lines still being written
    are skipped)."""
    out: dict[int, float] = {}
    with open(span_log) as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r["code"] == "OK" and r["batch_size"] == batch:
                out[r["batch_id"]] = r["kernel_ms"]
    return out


def kernel_rows(
    label: str, trace_path: str, kernel_ms: dict[int, float], explain: bool = False, graphs: bool = False
) -> list[list[object]]:
    """Rows comparing kernel spans with the profiler's windows. With CUDA graphs the span is the
    graph's own events, which hold neither idle stretch, so the adjusted rows are left out."""
    host_log: dict[int, list[str]] = {}
    windows = profiler_windows(trace_path, host_log)
    pairs = [(kernel_ms[b], w, ld, tl) for b, (w, ld, tl, _) in windows.items() if b in kernel_ms and w > 0]
    loose = sum(1 for b, w in windows.items() if b in kernel_ms and not w[3])
    if loose:
        print(f"{label}: {loose} batches without two event records between the copies (all kernels used)")
    checks = [(f"kernel span vs profiler, {label}", [abs(k - w) / w for k, w, _, _ in pairs])]
    if not graphs:
        checks += [
            ("  less GPU idle before the 1st kernel", [abs(k - ld - w) / w for k, w, ld, _ in pairs]),
            (
                "  less idle before and after the kernels",
                [abs(k - ld - tl - w) / w for k, w, ld, tl in pairs],
            ),
        ]
    rows: list[list[object]] = []
    for name, errs in checks:
        e = np.asarray(errs)
        if e.size:
            rows.append(
                [
                    name,
                    e.size,
                    f"{np.median(e) * 100:.3f} %",
                    f"{np.percentile(e, 99) * 100:.3f} %",
                    f"{(e <= 0.05).mean() * 100:.2f} % (<=5 %)",
                ]
            )
    if pairs:
        windows_ms = [w for _, w, _, _ in pairs]
        leads = [lead for _, _, lead, _ in pairs]
        tails = [tail for _, _, _, tail in pairs]
        print(
            f"{label}: profiler window median {np.median(windows_ms):.3f} ms; GPU idle between copy "
            f"and first kernel median {np.median(leads) * 1e3:.0f} us (max {max(leads) * 1e3:.0f}); "
            f"last kernel to end-event record median {np.median(tails) * 1e3:.0f} us "
            f"(max {max(tails) * 1e3:.0f}) over {len(pairs)} batches"
        )
        by_tail = sorted((w[2], b) for b, w in windows.items() if b in host_log)
        if by_tail:
            tail_ms, bid = by_tail[len(by_tail) // 2]
            print(f"  batch {bid} (median tail, {tail_ms * 1e3:.0f} us), us from its last kernel's end:")
            log = host_log[bid]
            for line in log if explain else log[-6:]:
                print("   ", line)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="image")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--profile-batches", type=int, default=20)
    ap.add_argument("--cuda-graphs", action="store_true", help="serve with --cuda-graphs (fixed shapes)")
    ap.add_argument("--explain", action="store_true", help="print one batch's whole host/GPU timeline")
    ap.add_argument("--serve-args", default="", help="extra `netgain serve` flags ('--intra-op-threads 1')")
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
    args += shlex.split(a.serve_args)
    rows = []
    quiet: dict[int, float] = {}
    with ServerProcess(args) as server:
        server.wait_ready()
        run_clients(
            server.target, a.model, processes=2, concurrency=a.batch, duration=a.duration, options=opts
        )
        if a.device.startswith("cuda"):
            # After the saturating run, so the server is warm: batches of this phase only.
            time.sleep(0.5)  # the span log is written every 50 ms
            before = span_log_kernels(span_log, a.batch)
            one_at_a_time(server.target, a, opts, 4.0)
            time.sleep(0.5)
            quiet = {b: k for b, k in span_log_kernels(span_log, a.batch).items() if b not in before}
        captures: list[tuple[str, Any]] = []
        if a.device.startswith("cuda"):
            for label, ranges_only in (("full", False), ("ranges-only", True)):
                captures.append((label, capture(server.target, a, opts, ranges_only)))
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
    for label, resp in captures:
        if isinstance(resp, Exception) or resp is None:
            print(f"{label} capture failed: {resp or 'no answer from the Profile RPC within 60 s'}")
            continue
        kernels = span_log_kernels(span_log, a.batch)
        rows += kernel_rows(f"{label} capture", resp.trace_path, kernels, a.explain, a.cuda_graphs)
    if a.device.startswith("cuda"):
        if a.serve_args:
            print(f"note: the standalone runner uses the defaults, not --serve-args {a.serve_args!r}")
        unprofiled, spans, trace_path = standalone(a, opts, tmp)
        rows += kernel_rows("standalone, ranges-only", trace_path, spans, a.explain, a.cuda_graphs)
        served = sorted(quiet.items())
        if served:
            srv = np.median([k for _, k in served]) * 1e3
            alone = np.median(unprofiled) * 1e3
            print(
                f"unprofiled, one batch at a time: kernel span median {srv:.1f} us in the server "
                f"({len(served)} batches), {alone:.1f} us standalone ({len(unprofiled)}): "
                f"{(srv / alone - 1) * 100:+.2f} %"
            )
    print(table(rows, ["check", "n", "median error", "p99 error", "share within 2 %"]))


if __name__ == "__main__":
    main()
