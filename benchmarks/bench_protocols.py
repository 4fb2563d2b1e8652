"""netgain.v1 and the Open Inference Protocol side by side: one server, the same rates, both protocols.

One ``netgain serve`` is driven by ``netgain load`` (Poisson arrivals, the same seed) at each rate
of ``--rates``, once with the default protocol and once with ``--protocol oip`` (the order
alternates from rate to rate, so drift of the host does not always favour one side). Per run,
from ``requests.parquet`` (measured rows, after the warm-up): the achieved rate, latency p50/p99
from the scheduled time, the server's own total from the ``server-timing`` trailer, and outside =
service time (done - sent) - server total per request: the network plus both sides' gRPC and
(de)serialization, which is where the two protocols differ (the queue, batching and model are
the same code). Client CPU per request is the sender engines' event-loop CPU (meta.json's
workers.cpu_ratio, gRPC's core threads not counted) times the run's length over requests sent.

The server and the load generator are pinned to separate cores (benchmarks/common.py ``pinned``,
``split_cpus``) when the host has at least 4 usable cores; with fewer they share them, and the
output says so.

    python benchmarks/bench_protocols.py --model null --rates 200,500,1000 --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import pinned, split_cpus, table

PROTOCOLS = ("netgain", "oip")
MIN_CORES_TO_PIN = 4  # each side gets at least 2: the server's frontend and device processes, and
# the load generator's master, worker and sender engine, would otherwise contend on one core


def netgain(*args: str) -> list[str]:
    return [sys.executable, "-m", "netgain.cli", *args]


def _pct(x: np.ndarray, q: float) -> float:
    from netgain.stats.quantiles import quantile

    return float(quantile(x, q)) if len(x) else float("nan")


def summarize(out: str, duration: float) -> dict[str, Any]:
    """The run's figures from its run directory (measured rows: after the warm-up)."""
    import pyarrow.parquet as pq

    t = pq.read_table(os.path.join(out, "requests.parquet"))
    with open(os.path.join(out, "meta.json")) as fh:
        meta = json.load(fh)

    def col(name: str) -> np.ndarray:
        return t.column(name).to_numpy(zero_copy_only=False)

    def ns(name: str) -> np.ndarray:  # nullable int64 -> float (NaN where missing)
        return np.asarray(t.column(name).cast("double").to_numpy(zero_copy_only=False), dtype=float)

    measured = ~col("warmup").astype(bool)
    ok = measured & (col("status") == "OK")
    scheduled, sent, done = ns("scheduled_ns"), ns("sent_ns"), ns("done_ns")
    latency = (done - scheduled)[ok] / 1e6
    service = (done - sent)[ok] / 1e6
    server = ns("server_total_ms")[ok]
    outside = service - server
    outside = outside[~np.isnan(outside)]
    n_sent = int((~np.isnan(sent)).sum())
    wall = float(meta.get("end_unix_s", 0.0)) - float(meta.get("start_unix_s", 0.0))
    cpu = sum((meta.get("workers") or {}).get("cpu_ratio", {}).values())
    send_lag = (sent - scheduled)[measured] / 1e6
    send_lag = send_lag[~np.isnan(send_lag)]
    return {
        "done_s": int(ok.sum()) / duration,
        "errors": int(measured.sum() - ok.sum()),
        "p50": _pct(latency, 0.5),
        "p99": _pct(latency, 0.99),
        "server_p50": _pct(server[~np.isnan(server)], 0.5),
        "outside_p50": _pct(outside, 0.5),
        "outside_p99": _pct(outside, 0.99),
        "client_cpu_us": 1e6 * cpu * wall / n_sent if n_sent and wall > 0 else float("nan"),
        "send_lag_p99": _pct(send_lag, 0.99),
        "valid": bool((meta.get("validity") or {}).get("valid", False)),
    }


def run_load(target: str, a: argparse.Namespace, protocol: str, rate: float, out: str) -> list[str]:
    cmd = [
        "load", "--target", target, "--arrival", "poisson", "--rate", f"{rate:g}",
        "--duration", str(a.duration), "--warmup-s", str(a.warmup_s), "--workers", str(a.load_workers),
        "--connections", str(a.connections), "--model", a.model, "--out", out, "--quiet",
        "--seed", "1", "--timeout-s", "5",
    ]  # fmt: skip
    if protocol == "oip":
        cmd += ["--protocol", "oip", "--oip-model", a.model]
    subprocess.run(netgain(*cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="null", help="netgain serve --model (null, image, ...)")
    ap.add_argument("--rates", default="200,500", help="comma-separated offered rates, requests/s")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", default="1", help="netgain serve --workers")
    ap.add_argument("--load-workers", type=int, default=1)
    ap.add_argument("--connections", type=int, default=1, help="netgain load --connections")
    ap.add_argument(
        "--server-cores", type=int, default=0, help="cores pinned to the server (default: half the usable)"
    )
    ap.add_argument("--serve-arg", action="append", default=[], help="extra netgain serve argument")
    a = ap.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",") if r.strip()]
    cores = sorted(os.sched_getaffinity(0))
    server_cpus, load_cpus = (None, None)
    if len(cores) >= MIN_CORES_TO_PIN:
        server_cpus, load_cpus = split_cpus(a.server_cores or len(cores) // 2)
    if server_cpus and load_cpus:
        placement = (
            f"server pinned to cores {sorted(server_cpus)}, load generator to cores {sorted(load_cpus)}"
        )
    else:
        placement = (
            f"placement SHARED: {len(cores)} usable core(s) (pinning needs {MIN_CORES_TO_PIN}); server "
            "and load generator compete for the same cores, so latencies include that contention"
        )
    print(f"host {os.uname().nodename}: {os.cpu_count()} cores, {len(cores)} usable; {placement}", flush=True)
    from netgain.experiments.orchestrate import ServerProcess

    serve = ["--model", a.model, "--device", a.device, "--workers", a.workers, *a.serve_arg]
    rows: list[list[object]] = []
    results: dict[tuple[float, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        with pinned(server_cpus):
            server = stack.enter_context(ServerProcess(serve, log_path=os.path.join(tmp, "server.log")))
            server.wait_ready()
        print(f"netgain serve {' '.join(serve)} on {server.target}", flush=True)
        for i, rate in enumerate(rates):
            order = PROTOCOLS if i % 2 == 0 else PROTOCOLS[::-1]
            for protocol in order:
                out = os.path.join(tmp, f"r{i}-{protocol}")
                with pinned(load_cpus):
                    cmd = run_load(server.target, a, protocol, rate, out)
                if i == 0:
                    print("  netgain " + " ".join(cmd).replace(out, "RUN_DIR"), flush=True)
                try:
                    r = summarize(out, a.duration)
                except (OSError, KeyError, ValueError) as exc:
                    print(f"  {rate:g}/s {protocol}: no result ({exc})", flush=True)
                    continue
                results[(rate, protocol)] = r
                rows.append([
                    f"{rate:g}", protocol, f"{r['done_s']:,.0f}", r["errors"], f"{r['p50']:.2f}",
                    f"{r['p99']:.2f}", f"{r['server_p50']:.3f}", f"{r['outside_p50']:.3f}",
                    f"{r['outside_p99']:.3f}", f"{r['client_cpu_us']:.0f}", f"{r['send_lag_p99']:.2f}",
                    "yes" if r["valid"] else "NO",
                ])  # fmt: skip
    print()
    print(table(rows, [
        "offered/s", "protocol", "done/s", "errors", "p50 ms", "p99 ms", "server p50 ms",
        "outside p50 ms", "outside p99 ms", "client CPU us/req", "send-lag p99 ms", "valid",
    ]))  # fmt: skip
    print("\n(latency from the scheduled time; server = the trailer's total; outside = (done - sent) - "
          "server total per request: network + both sides' gRPC and (de)serialization; client CPU = "
          "sender engines' event-loop thread only)")  # fmt: skip
    for rate in rates:
        ng, oip = results.get((rate, "netgain")), results.get((rate, "oip"))
        if ng and oip:
            d50 = 1e3 * (oip["outside_p50"] - ng["outside_p50"])
            dcpu = oip["client_cpu_us"] - ng["client_cpu_us"]
            print(f"{rate:g}/s: OIP - netgain.v1: outside p50 {d50:+.0f} us/request, latency p50 "
                  f"{oip['p50'] - ng['p50']:+.2f} ms, p99 {oip['p99'] - ng['p99']:+.2f} ms, client CPU "
                  f"{dcpu:+.0f} us/request")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
