"""Time `build_report` + `write_outputs` on synthetic runs of 1M to 100M requests; report peak RSS.

    python benchmarks/bench_report.py --rows 1000000 10000000 100000000

Each size is generated once (vectorised, one row group at a time, under --dir) and then measured
in a fresh child process, so the peak RSS printed is the report's alone. ``--mode`` picks the
report's path: ``auto`` (in memory up to ``stream.STREAM_ABOVE_ROWS`` rows, streamed above),
``memory`` or ``stream``. Per-row time and a 1-billion-row projection are printed too. Targets:
1M <= 10 s, 10M <= 60 s, 100M <= 3 min, all <= 4 GB peak RSS on 2 cores.

``--hours H`` spreads the rows over H hours instead of 5,000 req/s, with samples.parquet (what
`netgain load` scrapes once a second, ~20 rows) for all of them: a 24-hour soak's 1.7 million
sample rows with ``--hours 24``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

PHASES = ("queue", "pre", "h2d", "kernel", "d2h", "post")


def _chunk(rng: np.random.Generator, lo: int, n: int, t_lo: float, t_hi: float, warm_s: float) -> pa.Table:
    """Rows lo .. lo + n, scheduled uniformly (sorted) in [t_lo, t_hi) seconds."""
    sched = np.sort(rng.uniform(t_lo, t_hi, n) * 1e9).astype(np.int64)
    lag = rng.exponential(0.05, n)
    ph = {
        p: rng.lognormal(np.log(m), 0.3, n)
        for p, m in zip(PHASES, (1.0, 2.0, 0.2, 4.0, 0.1, 0.5), strict=True)
    }
    ph["kernel"][rng.random(n) < 0.02] += 30.0
    total = sum(ph.values())
    sent = sched + (lag * 1e6).astype(np.int64)
    done = sent + ((total + rng.exponential(0.3, n)) * 1e6).astype(np.int64)
    err = rng.random(n) < 0.001
    status = pa.DictionaryArray.from_arrays(pa.array(err.astype(np.int32)), pa.array(["OK", "UNAVAILABLE"]))
    idx = np.arange(lo, lo + n)
    cols = {
        "index": pa.array(idx),
        "request_id": pc.cast(pa.array(idx), pa.string()),
        "worker": pa.array((idx % 8).astype(np.int32)),
        "warmup": pa.array(sched < warm_s * 1e9),
        "scheduled_ns": pa.array(sched),
        "sent_ns": pa.array(sent),
        "done_ns": pa.array(done),
        "status": status,
        "items": pa.array(np.ones(n, np.int32)),
        "batch_id": pa.array(idx // 4),
        "batch_size": pa.array(rng.integers(1, 9, n).astype(np.int32)),
        **{f"{p}_ms": pa.array(v) for p, v in ph.items()},
        "server_total_ms": pa.array(total),
    }
    return pa.table(cols)


def generate(
    run: Path, n: int, rate: float = 5000.0, seed: int = 0, chunk: int = 1 << 20, hours: float | None = None
) -> None:
    """A run of n requests at ``rate``/s (or over ``hours``), written one row group at a time
    (memory: one chunk)."""
    rng = np.random.default_rng(seed)
    if hours:
        rate = n / (hours * 3600.0)
    duration = n / rate
    writer: pq.ParquetWriter | None = None
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        table = _chunk(rng, lo, m, lo / rate, (lo + m) / rate, 0.05 * duration)
        if writer is None:
            writer = pq.ParquetWriter(run / "requests.parquet", table.schema)
        writer.write_table(table, row_group_size=chunk)
    assert writer is not None
    writer.close()
    t = np.arange(0.0, duration, 1.0)
    k = len(t)
    # What `netgain load` scrapes once a second (~20 rows): gauges, CPU and kernel counters
    # (the report derives their ratios), per-role thread CPU and the workers' CPU ratios.
    series = [
        ("server:x", "netgain_gpu_utilization_ratio", "gpu=0", np.full(k, 0.6)),
        ("server:x", "netgain_queue_depth_requests", "", np.full(k, 3.0)),
        ("server:x", "netgain_in_flight_requests", "", np.full(k, 8.0)),
        ("server:x", "netgain_device_instances", "", np.ones(k)),
        ("server:x", "netgain_cpu_cores", "", np.full(k, 2.0)),
        ("server:x", "process_cpu_seconds_total", "", 0.9 * t),
        ("server:x", "netgain_kernel_busy_seconds_total", "", 0.5 * t),
        *(
            ("server:x", "netgain_thread_cpu_seconds_total", f"role={r}", 0.1 * t)
            for r in ("prepost", "device", "frontend", "batcher", "grpc", "metrics", "other")
        ),
        *((f"worker:{w}", "netgain_client_worker_cpu_ratio", "", np.full(k, 0.3)) for w in range(6)),
    ]
    # Time-major in row groups of 20,000 rows, as `netgain load` writes it (loadgen/runner/scrape.py).
    n_series = len(series)
    which = pa.array(np.tile(np.arange(n_series, dtype=np.int32), k))

    def strings(i: int) -> pa.Array:
        names = pa.array([s[i] for s in series])
        return pa.DictionaryArray.from_arrays(which, names).dictionary_decode()

    samples = pa.table(
        {
            "t_s": np.repeat(t, n_series),
            "source": strings(0),
            "metric": strings(1),
            "labels": strings(2),
            "value": np.stack([v for _, _, _, v in series]).T.ravel(),
        }
    )
    pq.write_table(samples, run / "samples.parquet", row_group_size=20_000)
    meta = {
        "schema": 1,
        "run_id": f"bench{n}",
        "config": {
            "rate": rate,
            "duration_s": 0.95 * duration,  # excludes the warm-up, as netgain load writes it
            "warmup_s": 0.05 * duration,
            "max_send_lag_ms": 5.0,
            "price_per_hour": 2.0,
            "slo_p99_ms": 100.0,
        },
        "server": {"device": "cuda", "model": "image", "cold_start": [{"name": "ready", "at_s": 12.0}]},
        "trace": {"digest": "b" * 64, "duration_s": duration, "requests": n, "mean_rate": rate},
        "validity": {"valid": True, "reasons": []},
        "counts": {"dropped": 0},
    }
    (run / "meta.json").write_text(json.dumps(meta))


def measure(run: Path, mode: str) -> dict[str, float]:
    from netgain.analysis import build_report, stream, write_outputs

    if mode != "auto":
        stream.STREAM_ABOVE_ROWS = 0 if mode == "stream" else 1 << 62

    t0 = time.perf_counter()
    report = build_report(run)
    t1 = time.perf_counter()
    write_outputs(report, run)
    t2 = time.perf_counter()
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"build_s": t1 - t0, "write_s": t2 - t1, "total_s": t2 - t0, "peak_rss_mb": rss_kb / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--mode", choices=("auto", "memory", "stream"), default="auto")
    ap.add_argument(
        "--dir", default=None, help="where the synthetic runs are written (default: the temp dir)"
    )
    ap.add_argument("--hours", type=float, default=None, help="spread the rows over this many hours")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.mode)))
        return
    print(f"cpus {os.cpu_count()}  python {sys.version.split()[0]}  mode {args.mode}  hours {args.hours}")
    print(
        f"{'rows':>12} {'generate s':>11} {'build s':>8} {'write s':>8} {'total s':>8} {'peak RSS MB':>12} "
        f"{'us/row':>7} {'1e9 rows s':>10} {'load avg':>9}"
    )
    for n in args.rows:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            run = Path(tmp)
            g0 = time.perf_counter()
            generate(run, n, hours=args.hours)
            gen_s = time.perf_counter() - g0
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(run), "--mode", args.mode],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            m = json.loads(out.strip().splitlines()[-1])
            print(
                f"{n:>12} {gen_s:>11.1f} {m['build_s']:>8.2f} {m['write_s']:>8.2f} {m['total_s']:>8.2f} "
                f"{m['peak_rss_mb']:>12.0f} {m['total_s'] / n * 1e6:>7.2f} {m['total_s'] / n * 1e9:>10.0f} "
                f"{os.getloadavg()[0]:>9.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
