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

from netgain.contract.phases import PHASES
from netgain.experiments.kernels import kernel_spans, matched, profiler_windows, span_errors
from netgain.experiments.orchestrate import ServerProcess
from netgain.stats.quantiles import median, quantile


def phase_sum_errors(span_log: str) -> np.ndarray:
    errs = []
    with open(span_log) as fh:
        for line in fh:
            r = json.loads(line)
            if r["code"] != "OK" or r["total_ms"] <= 0:
                continue
            s = sum(r[f"{p}_ms"] for p in PHASES)
            errs.append(abs(r["total_ms"] - s) / r["total_ms"])
    return np.asarray(errs)


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

    from netgain.server.batching.profile import user_ranges_profiler
    from netgain.server.device import DeviceRunner
    from netgain.server.handlers import create_handler

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

    from netgain.protos import InferenceStub, pb

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


def kernel_rows(
    label: str, trace_path: str, kernel_ms: dict[int, float], explain: bool = False, graphs: bool = False
) -> list[list[object]]:
    """Rows comparing kernel spans with the profiler's windows. With CUDA graphs the span is the
    graph's own events, which hold neither idle stretch, so the adjusted rows are left out."""
    host_log: dict[int, list[str]] = {}
    windows = profiler_windows(trace_path, host_log)
    pairs = matched(windows, kernel_ms)
    loose = sum(1 for _, w in pairs if not w.bracketed)
    if loose:
        print(f"{label}: {loose} batches without two event records between the copies (all kernels used)")
    errors = span_errors(pairs)
    checks = [(f"kernel span vs profiler, {label}", errors["span"])]
    if not graphs:
        checks += [
            ("  less GPU idle before the 1st kernel", errors["less_idle_before"]),
            ("  less idle before and after the kernels", errors["less_idle"]),
        ]
    rows: list[list[object]] = []
    for name, e in checks:
        if e.size:
            rows.append(
                [
                    name,
                    e.size,
                    f"{median(e) * 100:.3f} %",
                    f"{quantile(e, 0.99) * 100:.3f} %",
                    f"{(e <= 0.05).mean() * 100:.2f} % (<=5 %)",
                ]
            )
    if pairs:
        leads = [w.idle_before_ms for _, w in pairs]
        tails = [w.idle_after_ms for _, w in pairs]
        print(
            f"{label}: profiler window median {median([w.window_ms for _, w in pairs]):.3f} ms; "
            f"GPU idle between copy and first kernel median {median(leads) * 1e3:.0f} us "
            f"(max {max(leads) * 1e3:.0f}); "
            f"last kernel to end-event record median {median(tails) * 1e3:.0f} us "
            f"(max {max(tails) * 1e3:.0f}) over {len(pairs)} batches"
        )
        by_tail = sorted((w.idle_after_ms, b) for b, w in windows.items() if b in host_log)
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
    captures: list[tuple[str, Any]] = []
    with ServerProcess(args) as server:
        server.wait_ready()
        run_clients(
            server.target, a.model, processes=2, concurrency=a.batch, duration=a.duration, options=opts
        )
        if a.device.startswith("cuda"):
            # After the saturating run, so the server is warm: batches of this phase only.
            time.sleep(0.5)  # the span log is written every 50 ms
            before = kernel_spans(span_log, a.batch)
            one_at_a_time(server.target, a, opts, 4.0)
            time.sleep(0.5)
            quiet = {b: k for b, k in kernel_spans(span_log, a.batch).items() if b not in before}
            for label, ranges_only in (("full", False), ("ranges-only", True)):
                captures.append((label, capture(server.target, a, opts, ranges_only)))
    errs = phase_sum_errors(span_log)
    rows.append(
        [
            "phases vs total",
            len(errs),
            f"{median(errs) * 100:.3f} %",
            f"{quantile(errs, 0.99) * 100:.3f} %",
            f"{(errs <= 0.02).mean() * 100:.2f} %",
        ]
    )
    kernels = kernel_spans(span_log, a.batch)  # the server has stopped: the whole log
    for label, resp in captures:
        if isinstance(resp, Exception) or resp is None:
            print(f"{label} capture failed: {resp or 'no answer from the Profile RPC within 60 s'}")
            continue
        rows += kernel_rows(f"{label} capture", resp.trace_path, kernels, a.explain, a.cuda_graphs)
    if a.device.startswith("cuda"):
        if a.serve_args:
            print(f"note: the standalone runner uses the defaults, not --serve-args {a.serve_args!r}")
        unprofiled, spans, trace_path = standalone(a, opts, tmp)
        rows += kernel_rows("standalone, ranges-only", trace_path, spans, a.explain, a.cuda_graphs)
        if quiet:
            srv = median(list(quiet.values())) * 1e3
            alone = median(unprofiled) * 1e3
            print(
                f"unprofiled, one batch at a time: kernel span median {srv:.1f} us in the server "
                f"({len(quiet)} batches), {alone:.1f} us standalone ({len(unprofiled)}): "
                f"{(srv / alone - 1) * 100:+.2f} %"
            )
    print(table(rows, ["check", "n", "median error", "p99 error", "share within 2 %"]))


if __name__ == "__main__":
    main()
