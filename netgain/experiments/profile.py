"""``netgain profile``: under steady load, a torch.profiler Chrome trace (with the NVTX phase
ranges) and a py-spy CPU profile of the server, summarised beside the phase spans.

The py-spy profile is taken with idle frames included, so time the server spends waiting
inside the inference call (the device thread blocked in a CUDA synchronisation) shows as
waiting rather than vanishing from the CPU profile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import grpc

from netgain.contract.phases import PHASES
from netgain.experiments.kernels import kernel_spans, profiler_windows, span_check
from netgain.experiments.orchestrate import ServerProcess
from netgain.protos import InferenceStub, pb
from netgain.stats.quantiles import median, quantiles


def phase_medians(span_log: str) -> dict[str, float]:
    rows = [json.loads(line) for line in open(span_log) if line.strip()]  # noqa: SIM115
    ok = [r for r in rows if r["code"] == "OK"]
    if not ok:
        return {}
    return {p: median([r[f"{p}_ms"] for r in ok]) for p in (*PHASES, "total")}


def trace_top_ops(trace_path: str, top: int = 8) -> dict[str, Any]:
    with open(trace_path) as fh:
        events = json.load(fh).get("traceEvents", [])
    kernels: dict[str, float] = {}
    ops: dict[str, float] = {}
    copies = batches_ms = 0.0
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "cpu_op":  # nested (inclusive) times: ranked, never added up
            name = str(e.get("name"))[:80]
            ops[name] = ops.get(name, 0.0) + float(e.get("dur", 0.0)) / 1e3
        elif e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("netgain_batch"):
            batches_ms += float(e.get("dur", 0.0)) / 1e3
        elif e.get("cat") == "kernel":
            name = str(e.get("name"))[:80]
            kernels[name] = kernels.get(name, 0.0) + float(e.get("dur", 0.0)) / 1e3
        elif e.get("cat") == "gpu_memcpy":
            copies += float(e.get("dur", 0.0)) / 1e3
    total = sum(kernels.values())
    return {
        "kernel_ms_total": total,
        "memcpy_ms_total": copies,
        "top_kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:top]),
        "batches_ms_total": batches_ms,
        "top_cpu_ops_ms": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:top]),
    }


OVERHEAD_RATIO = 1.5  # server p99 while profiling this much above the rest: the profiler's cost shows


def profiler_overhead(span_log: str, window_unix_s: tuple[float, float], run_dir: str) -> dict[str, Any]:
    """The profiler's own cost, measured: the server's p99 total of requests that arrived while it
    profiled (start-up included) against the requests before and after, and the load's p99 over
    the run (which includes both)."""
    rows = [json.loads(line) for line in open(span_log) if line.strip()]  # noqa: SIM115
    t0, t1 = (int(t * 1e9) for t in window_unix_s)
    ok = [r for r in rows if r.get("code") == "OK"]
    during = sorted(float(r["total_ms"]) for r in ok if t0 <= int(r.get("arrival_unix_ns", 0)) <= t1)
    rest = sorted(float(r["total_ms"]) for r in ok if not t0 <= int(r.get("arrival_unix_ns", 0)) <= t1)
    out: dict[str, Any] = {
        "window_s": (t1 - t0) / 1e9,
        "during_requests": len(during),
        "during_p99_ms": quantiles(during, [0.99])[0] if during else None,
        "others_requests": len(rest),
        "others_p99_ms": quantiles(rest, [0.99])[0] if rest else None,
        "load_p99_ms": _load_p99(run_dir),
    }
    a, b = out["during_p99_ms"], out["others_p99_ms"]
    out["ratio"] = a / b if a is not None and b else None
    # The client's p99 far above every server p99: the stall was outside the spans (the host busy
    # profiling, requests waiting to be read), and still the profiler's.
    server_p99 = max((v for v in (a, b) if v is not None), default=None)
    client = out["load_p99_ms"]
    out["inflated"] = (out["ratio"] is not None and out["ratio"] >= OVERHEAD_RATIO) or (
        client is not None and server_p99 is not None and client >= OVERHEAD_RATIO * server_p99
    )
    return out


def _load_p99(run_dir: str) -> float | None:
    import pyarrow.parquet as pq

    try:
        d = pq.read_table(
            os.path.join(run_dir, "requests.parquet"), columns=["status", "scheduled_ns", "done_ns"]
        )
    except Exception:  # the load failed: its own line said why
        return None
    cols = d.to_pydict()
    lat = sorted(
        (done - sched) / 1e6
        for st, sched, done in zip(cols["status"], cols["scheduled_ns"], cols["done_ns"], strict=True)
        if st == "OK" and done is not None
    )
    return quantiles(lat, [0.99])[0] if lat else None


def pyspy_summary(path: str, top: int = 6) -> dict[str, Any]:
    """Per thread: share of samples by leaf frame, and the share spent waiting on the device."""
    with open(path) as fh:
        doc = json.load(fh)
    frames = doc["shared"]["frames"]
    out: dict[str, Any] = {}
    for prof in doc.get("profiles", []):
        leaves: Counter[str] = Counter()
        waiting = 0.0
        total = 0.0
        for stack, weight in zip(prof.get("samples", []), prof.get("weights", []), strict=False):
            if not stack:
                continue
            names = [frames[i]["name"] for i in stack]
            leaves[names[-1]] += weight
            total += weight
            if any("synchronize" in n for n in names):
                waiting += weight
        if total:
            out[prof.get("name", "?")] = {
                "samples": total,
                "waiting_on_device_share": waiting / total,
                "top_leaf_share": {k: v / total for k, v in leaves.most_common(top)},
            }
    return out


def run_profile(
    model: str,
    device: str,
    serve_args: list[str],
    out: str,
    rate: float,
    duration_s: float,
    batches: int,
    workers: int,
    ranges_only: bool = False,
) -> dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    span_log = os.path.join(out, "spans.jsonl")
    args = ["--model", model, "--device", device, "--profile-dir", out, "--span-log", span_log, *serve_args]
    if device.startswith("cuda"):
        args.append("--nvtx")
    summary: dict[str, Any] = {"model": model, "device": device}
    with ServerProcess(args, log_path=os.path.join(out, "server.log")) as sp:
        sp.wait_ready()
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "netgain.cli",
                "load",
                "--target",
                sp.target,
                "--arrival",
                "poisson",
                "--rate",
                str(rate),
                "--duration",
                str(duration_s),
                "--warmup-s",
                "1",
                "--workers",
                str(workers),
                "--out",
                os.path.join(out, "run"),
                "--quiet",
            ],
            stdin=subprocess.DEVNULL,
        )
        time.sleep(2.0)
        spy = None
        pyspy = shutil.which("py-spy")
        spy_path = os.path.join(out, "pyspy.speedscope.json")
        if pyspy:
            spy = subprocess.Popen(
                [
                    pyspy,
                    "record",
                    "-p",
                    str(sp.pid),
                    "-d",
                    str(max(2, int(duration_s - 3))),
                    "-f",
                    "speedscope",
                    "-o",
                    spy_path,
                    "--threads",
                    "--idle",
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            summary["pyspy"] = "py-spy not installed (pip install py-spy): no CPU profile"
        profiling_from = time.time()
        with grpc.insecure_channel(sp.target) as ch:
            resp = InferenceStub(ch).Profile(
                pb.ProfileRequest(batches=batches, ranges_only=ranges_only), timeout=duration_s + 120
            )
        window = (profiling_from, time.time())
        summary["trace"] = resp.trace_path
        summary["trace_batches"] = list(resp.batch_ids)
        load.wait()
        if spy is not None:
            spy.wait(120)
    summary["phases_median_ms"] = phase_medians(span_log)
    summary["torch_profiler"] = trace_top_ops(summary["trace"])
    summary["ranges_only"] = ranges_only
    summary["profiler_overhead"] = profiler_overhead(span_log, window, os.path.join(out, "run"))
    check = span_check(profiler_windows(summary["trace"]), kernel_spans(span_log))
    if check["batches"]:  # a device with kernels in the trace
        summary["kernel_span_vs_profiler"] = check
    if os.path.exists(spy_path):
        summary["pyspy"] = pyspy_summary(spy_path)
        summary["pyspy_file"] = spy_path
    with open(os.path.join(out, "profile-summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    return summary


def overhead_lines(o: dict[str, Any]) -> list[str]:
    """The profiler's cost as measured, flagged when the profiled batches were much slower."""
    if o.get("ratio") is None:
        return []

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} ms"

    head = "PROFILER OVERHEAD" if o["inflated"] else "profiler overhead"
    line = (
        f"{head}: server p99 {ms(o['during_p99_ms'])} for the {o['during_requests']} requests that "
        f"arrived while profiling ({o['window_s']:.1f} s, start-up included), {ms(o['others_p99_ms'])} "
        f"for the {o['others_requests']} others (x{o['ratio']:.1f}); the load's p99 over the run "
        f"{ms(o['load_p99_ms'])}"
    )
    if o["inflated"]:
        line += (
            ". The profiler's own cost is in these figures and in the trace's times: read the trace "
            "for proportions, and take latency from a run without profiling (netgain load + report)"
        )
    return ["", line]


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"# profile: {summary['model']} on {summary['device']}",
        "",
        f"Chrome trace (open in Perfetto): {summary.get('trace')}",
        "",
    ]
    lines.append(
        "Median phase spans (ms): "
        + ", ".join(f"{k} {v:.3f}" for k, v in summary.get("phases_median_ms", {}).items())
    )
    tp = summary.get("torch_profiler", {})
    n = len(summary.get("trace_batches", []))
    if tp.get("top_kernels_ms") or tp.get("memcpy_ms_total"):
        lines += [
            "",
            f"torch.profiler over {n} batches: kernels {tp.get('kernel_ms_total', 0):.2f} ms, "
            f"copies {tp.get('memcpy_ms_total', 0):.2f} ms",
        ]
        lines += [f"  {ms:9.3f} ms  {name}" for name, ms in tp.get("top_kernels_ms", {}).items()]
    else:  # a CPU run: operators, no device kernels or copies to count
        lines += [
            "",
            f"torch.profiler over {n} batches on the CPU ({tp.get('batches_ms_total', 0):.2f} ms of batches; "
            "no device kernels or copies): top operators, inclusive time",
        ]
        lines += [f"  {ms:9.3f} ms  {name}" for name, ms in tp.get("top_cpu_ops_ms", {}).items()]
    lines += overhead_lines(summary.get("profiler_overhead") or {})
    ks = summary.get("kernel_span_vs_profiler")
    if ks:
        lines += [
            "",
            f"kernel span vs torch.profiler, {ks['batches']} batches: median error "
            f"{ks['median_error']:.1%}, {ks['within_5pct']:.0%} within 5 %; GPU idle inside the span "
            f"(median): {ks['idle_before_first_us_median']:.0f} us before the first kernel, "
            f"{ks['idle_after_last_us_median']:.0f} us after the last (the host still launching); "
            f"without them {ks['median_error_without_idle']:.1%}",
        ]
    spy = summary.get("pyspy")
    if isinstance(spy, dict):
        lines += ["", "py-spy (idle included), per thread:"]
        for thread, info in sorted(spy.items(), key=lambda kv: -kv[1]["samples"])[:8]:
            tops = ", ".join(f"{k} {v:.0%}" for k, v in list(info["top_leaf_share"].items())[:3])
            lines.append(f"  {thread}: waiting on device {info['waiting_on_device_share']:.0%}; {tops}")
    elif spy:
        lines += ["", str(spy)]
    return "\n".join(lines)
