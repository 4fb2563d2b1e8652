"""Soak: `netgain serve` + `netgain load` for M minutes; RSS of every process sampled, slopes printed.

    python benchmarks/bench_soak.py --minutes 30 --rate 200 --model null --workers 1 --span-log-max-mb 4

Every ``--sample-s`` seconds psutil reads the RSS of the server, the Locust master and each
worker, the span log's size (``FILE`` + ``FILE.1``) and the size of one ``/metrics`` scrape.
At the end it prints, per process, the RSS at the start and end of the measured window and the
least-squares slope in MB/hour over the measured window and over its second half (the first
``--settle-s`` seconds are excluded: imports, pools and allocator arenas filling up), plus the
run's request accounting. ``--report`` then runs ``netgain report RUN --span-log FILE`` as the
README's step 3 does and samples its RSS too. ``--json FILE`` keeps every
sample. Exit 1 when a second-half slope is above ``--max-slope-mb-h`` or a request is unaccounted for.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


@dataclass
class Series:
    t_s: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    def add(self, t: float, rss: float) -> None:
        self.t_s.append(t)
        self.rss_mb.append(rss)

    def window(self, t0: float) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(self.t_s)
        r = np.asarray(self.rss_mb)
        keep = t >= t0
        return t[keep], r[keep]


def slope_mb_per_hour(t_s: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y (MB) against t (s), in MB/hour."""
    if t_s.size < 3 or float(np.ptp(t_s)) <= 0:
        return float("nan")
    a, _b = np.polyfit(t_s, y, 1)
    return float(a) * 3600.0


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("NETGAIN_")}
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def wait_ports(ports_file: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> dict[str, int]:
    end = time.monotonic() + timeout_s
    while not ports_file.exists():
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} during start-up")
        if time.monotonic() > end:
            raise SystemExit("server did not write its ports file in time")
        time.sleep(0.05)
    return {k: int(v) for k, v in json.loads(ports_file.read_text()).items()}


def rss_mb(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).memory_info().rss) / MB
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def span_log_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(str(path) + ".1")) if p.exists())


def metrics_bytes(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5.0) as resp:
            return len(resp.read())
    except OSError:
        return -1


def report(run_dir: Path, span_log: Path, work: Path) -> dict[str, Any]:
    """``netgain report RUN --span-log FILE`` (the README's step 3), its RSS sampled every 0.2 s."""
    cmd = [sys.executable, "-m", "netgain.cli", "report", str(run_dir), "--span-log", str(span_log)]
    rss: list[float] = []
    t0 = time.monotonic()
    with open(work / "report.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env())
        while proc.poll() is None:
            mb = rss_mb(proc.pid)
            if mb is not None:
                rss.append(mb)
            time.sleep(0.2)
    lines = (work / "report.out").read_text(errors="replace").splitlines()
    return {
        "rc": proc.returncode,
        "wall_s": time.monotonic() - t0,
        "max_mb": max(rss, default=float("nan")),
        "rss_mb": rss,
        "first_line": lines[0] if lines else "",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s (Poisson)")
    ap.add_argument("--model", default="null")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--span-log-max-mb", type=float, default=4.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--settle-s", type=float, default=60.0, help="excluded from the slopes")
    ap.add_argument("--max-slope-mb-h", type=float, default=50.0, help="fail above this slope")
    ap.add_argument("--dir", default="", help="working directory (default: a temporary one)")
    ap.add_argument("--json", default="", help="write every sample and the summary here")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `netgain serve` argument")
    ap.add_argument("--report", action="store_true", help="then `netgain report` the run (its RSS sampled)")
    args = ap.parse_args(argv)

    work = Path(args.dir or tempfile.mkdtemp(prefix="netgain-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    ports_file, span_log, run_dir = work / "ports.json", work / "spans.jsonl", work / "run"
    duration_s = args.minutes * 60.0
    server_cmd = [
        sys.executable,
        "-m",
        "netgain.server",
        "--model",
        args.model,
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--ports-file",
        str(ports_file),
        "--span-log",
        str(span_log),
        "--span-log-max-mb",
        str(args.span_log_max_mb),
        "--max-batch-size",
        str(args.max_batch_size),
        *args.server_arg,
    ]
    with open(work / "server.out", "wb") as out:
        server = subprocess.Popen(
            server_cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env()
        )
    load: subprocess.Popen[bytes] | None = None
    series: dict[str, Series] = {}
    span_sizes: list[tuple[float, int]] = []
    metric_sizes: list[tuple[float, int]] = []
    try:
        ports = wait_ports(ports_file, server)
        target = f"127.0.0.1:{ports['grpc']}"
        load_cmd = [
            sys.executable,
            "-m",
            "netgain.cli",
            "load",
            "--target",
            target,
            "--rate",
            str(args.rate),
            "--duration",
            str(duration_s),
            "--warmup-s",
            "0",
            "--workers",
            str(args.workers),
            "--out",
            str(run_dir),
            "--quiet",
            "--wait-ready-s",
            "120",
            "--max-send-lag-ms",
            "50",
        ]
        with open(work / "load.out", "wb") as out:
            load = subprocess.Popen(
                load_cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env()
            )
        master = psutil.Process(load.pid)
        t0 = time.monotonic()
        next_print = t0
        print(
            f"soak: {args.minutes:g} min at {args.rate:g} req/s, model {args.model}, "
            f"{args.workers} worker(s); dir {work}",
            flush=True,
        )
        while load.poll() is None:
            t = time.monotonic() - t0
            pids = {"server": server.pid, "master": load.pid}
            try:
                kids = [c for c in master.children() if "netgain.loadgen.runner" in " ".join(c.cmdline())]
            except psutil.Error:
                kids = []
            for k, c in enumerate(sorted(kids, key=lambda c: c.pid)):
                pids[f"worker{k}"] = c.pid
                try:  # the worker's sender engine, a child process of its own
                    for e in c.children():
                        pids[f"engine{k}"] = e.pid
                except psutil.Error:
                    pass
            for name, pid in pids.items():
                rss = rss_mb(pid)
                if rss is not None:
                    series.setdefault(name, Series()).add(t, rss)
            span_sizes.append((t, span_log_bytes(span_log)))
            metric_sizes.append((t, metrics_bytes(ports["metrics"])))
            if time.monotonic() >= next_print:
                rss_txt = "  ".join(f"{n} {s.rss_mb[-1]:.0f} MB" for n, s in series.items() if s.rss_mb)
                print(f"  t={t:6.0f} s  {rss_txt}  span log {span_sizes[-1][1] / MB:.1f} MB", flush=True)
                next_print += 60.0
            time.sleep(args.sample_s)
        load_rc = load.returncode
    finally:
        if load is not None and load.poll() is None:
            load.send_signal(signal.SIGINT)
            try:
                load.wait(60)
            except subprocess.TimeoutExpired:
                load.kill()
        server.send_signal(signal.SIGTERM)
        try:
            server_rc = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server_rc = -9

    meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
    counts = meta.get("counts", {})
    accounted = sum(counts.get(k, 0) for k in ("ok", "errors", "dropped", "not_sent", "worker_lost"))
    lost = counts.get("scheduled", 0) - accounted
    summary: dict[str, Any] = {
        "minutes": args.minutes,
        "rate": args.rate,
        "model": args.model,
        "workers": args.workers,
        "load_rc": load_rc,
        "server_rc": server_rc,
        "counts": counts,
        "lost": lost,
        "processes": {},
    }
    print(
        f"\n{'process':<10} {'samples':>7} {'start MB':>9} {'mid MB':>8} {'end MB':>8} {'max MB':>8} "
        f"{'slope MB/h':>11} {'2nd half MB/h':>14}"
    )
    worst = 0.0
    for name, s in series.items():
        tw, r = s.window(min(args.settle_s, duration_s / 4))
        if r.size == 0:
            continue
        slope = slope_mb_per_hour(tw, r)
        # A leak grows in both halves; a step while pools and buffers fill (or during a burst the
        # host imposed) shows only in the first. The verdict uses the second half.
        half = tw >= tw[0] + (tw[-1] - tw[0]) / 2
        slope2 = slope_mb_per_hour(tw[half], r[half])
        worst = max(worst, slope2) if np.isfinite(slope2) else worst
        summary["processes"][name] = {
            "samples": int(r.size),
            "start_mb": float(r[0]),
            "mid_mb": float(r[r.size // 2]),
            "end_mb": float(r[-1]),
            "max_mb": float(r.max()),
            "slope_mb_per_h": slope,
            "second_half_slope_mb_per_h": slope2,
        }
        print(
            f"{name:<10} {r.size:>7} {r[0]:>9.1f} {r[r.size // 2]:>8.1f} {r[-1]:>8.1f} {r.max():>8.1f} "
            f"{slope:>11.2f} {slope2:>14.2f}"
        )
    span_max = max((b for _, b in span_sizes), default=0)
    final_span = span_log_bytes(span_log)
    metric_vals = [b for _, b in metric_sizes if b >= 0]
    summary.update(
        span_log_max_bytes=span_max,
        span_log_final_bytes=final_span,
        span_log_rotated=Path(str(span_log) + ".1").exists(),
        metrics_bytes_first=metric_vals[0] if metric_vals else -1,
        metrics_bytes_last=metric_vals[-1] if metric_vals else -1,
    )
    print(
        f"\nspan log: max {span_max / MB:.2f} MB, final {final_span / MB:.2f} MB (FILE + FILE.1; "
        f"limit {args.span_log_max_mb:g} MB per file; rotated: {summary['span_log_rotated']})"
    )
    if metric_vals:
        print(
            f"/metrics scrape: {metric_vals[0]} bytes first, {metric_vals[-1]} bytes last, "
            f"max {max(metric_vals)}"
        )
    print(f"requests: {json.dumps(counts)}; unaccounted {lost}; load exit {load_rc}, server exit {server_rc}")
    report_rc = 0
    if args.report:
        summary["report"] = rep = report(run_dir, span_log, work)
        report_rc = rep["rc"]
        print(
            f"netgain report: exit {rep['rc']}, {rep['wall_s']:.1f} s, peak RSS {rep['max_mb']:.0f} MB "
            f"(sampled every 0.2 s); its first line: {rep['first_line']}"
        )
    if args.json:
        summary["samples"] = {n: {"t_s": s.t_s, "rss_mb": s.rss_mb} for n, s in series.items()}
        summary["span_log_bytes"] = span_sizes
        Path(args.json).write_text(json.dumps(summary, indent=1))
    bad = worst > args.max_slope_mb_h or lost != 0 or server_rc != 0 or report_rc != 0
    bad = bad or span_max > 2.2 * args.span_log_max_mb * MB > 0
    print("SOAK " + ("FAILED" if bad else "PASSED"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
