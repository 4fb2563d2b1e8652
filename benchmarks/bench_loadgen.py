"""Load generator benchmarks, side by side in one run: capacity (ours vs stock closed-loop Locust),
fidelity at 80 % of one worker's capacity, and timing accuracy against the server's own spans.

Targets (issue 3): >= 2,500 req/s per worker against the null model; 8 workers >= 7x one;
at 80 % of capacity send-lag p99 <= 1 ms, achieved rate within 1 %, replayed inter-arrivals
match the trace (KS <= 0.02).
``--protocols netgain,oip-http,http-json`` measures the HTTP senders beside gRPC: capacity and
fidelity against canned null HTTP servers (benchmarks/null_targets.py), stock Locust's FastHttpUser
beside them (no accuracy rows: those servers' Server-Timing is canned). ``--canned`` puts gRPC
against canned servers too (else `netgain serve --model null`), so the protocols compare alike.
Usage: python benchmarks/bench_loadgen.py [--servers 4] [--workers 1,8] [--duration 10]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import pyarrow.parquet as pq
from common import null_servers, table
from null_targets import canned_servers

from netgain.experiments.orchestrate import free_port, run_load
from netgain.stats.quantiles import quantile

LOCUSTFILE = '''
import time, grpc, grpc.experimental.gevent as grpc_gevent
grpc_gevent.init_gevent()
from locust import User, task, constant
from netgain.protos.service import SERVICE_NAME
from netgain.loadgen.payloads import PayloadFactory
BODY = PayloadFactory("null").request_bytes(0, 0, 1)

class GrpcUser(User):
    """The Locust gRPC example's pattern: closed loop, one call per task, ms response times."""
    wait_time = constant(0)
    def on_start(self):
        # One connection per user (as ours uses several), so SO_REUSEPORT spreads users over servers.
        ch = grpc.insecure_channel(self.host, [("grpc.use_local_subchannel_pool", 1)])
        self.call = ch.unary_unary(f"/{SERVICE_NAME}/Infer", None, None)
    @task
    def infer(self):
        t0 = time.perf_counter()
        exc = None
        try:
            self.call(BODY, timeout=10)
        except grpc.RpcError as e:
            exc = e
        self.environment.events.request.fire(request_type="grpc", name="Infer",
            response_time=(time.perf_counter() - t0) * 1000, response_length=0, exception=exc, context={})
'''


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(
        np.max(
            np.abs(np.searchsorted(a, grid, "right") / a.size - np.searchsorted(b, grid, "right") / b.size)
        )
    )


HTTP_LOCUSTFILE = """
from locust import FastHttpUser, task, constant

class JsonUser(FastHttpUser):
    \"\"\"Locust's fast HTTP client (geventhttpclient), closed loop: the same request as ours.\"\"\"
    wait_time = constant(0)
    @task
    def predict(self):
        self.client.post("/predict", data=BODY, headers={"Content-Type": "application/json"})
"""


def protocol_args(protocol: str, tmp: str) -> list[str]:
    """``netgain load`` flags for ``protocol`` against the null servers of its kind."""
    if protocol == "oip-http":
        return ["--protocol", "oip-http", "--oip-model", "null", "--model", "null"]
    if protocol == "http-json":
        template = os.path.join(tmp, "request.json")
        with open(template, "w") as fh:
            json.dump({"path": "/predict", "body": {"data": "{payload_b64}"}}, fh)
        return ["--protocol", "http-json", "--model", "null", "--request-template", template]
    return []


def ours(
    target: str,
    out: str,
    rate: float,
    duration: float,
    workers: int,
    in_flight: int = 100_000,
    extra: list[str] | None = None,
) -> dict:
    rc = run_load(
        [
            "--target",
            target,
            "--arrival",
            "poisson",
            "--rate",
            f"{rate:g}",
            "--duration",
            str(duration),
            "--warmup-s",
            "1",
            "--workers",
            str(workers),
            "--out",
            out,
            "--max-send-lag-ms",
            "1e9",
            "--max-in-flight",
            str(in_flight),
            "--connections",
            "8",
            "--seed",
            "1",
            *(extra or []),
        ],
        quiet=True,
    )
    if not os.path.exists(os.path.join(out, "requests.parquet")):
        raise SystemExit(f"netgain load failed (exit {rc}) for {out}")
    t = pq.read_table(os.path.join(out, "requests.parquet")).to_pydict()
    sched = np.asarray(t["scheduled_ns"], dtype=np.int64)
    sent = np.asarray([s if s is not None else -1 for s in t["sent_ns"]], dtype=np.int64)
    done = np.asarray([d if d is not None else -1 for d in t["done_ns"]], dtype=np.int64)
    ok = np.asarray([s == "OK" for s in t["status"]])
    measured = ~np.asarray(t["warmup"]) & (sent >= 0)
    span = (sent[measured].max() - sent[measured].min()) / 1e9
    order = np.argsort(sched[measured])
    lag_ms = (sent[measured] - sched[measured]) / 1e6
    with open(os.path.join(out, "meta.json")) as fh:
        cpu = json.load(fh)["workers"]["cpu_ratio"]
    return {
        "rc": rc,
        "rows": len(sched),
        "dropped": int(sum(s == "DROPPED" for s in t["status"])),
        "worker_cpu_max": max(cpu.values()) if cpu else float("nan"),
        "ok": int(ok.sum()),
        "achieved_rps": measured.sum() / span,
        "lag_p50_ms": quantile(lag_ms, 0.5),
        "lag_p99_ms": quantile(lag_ms, 0.99),
        "ks": ks_statistic(np.diff(sched[measured][order]) / 1e6, np.diff(sent[measured][order]) / 1e6),
        "service_ms": (done[ok & measured] - sent[ok & measured]) / 1e6,
        "server_ms": np.asarray(t["server_total_ms"], dtype=float)[ok & measured],
    }


def stock_locust(target: str, users: int, duration: float, http: bool = False) -> dict:
    tmp = tempfile.mkdtemp()
    lf = os.path.join(tmp, "locustfile.py")
    with open(lf, "w") as fh:
        if http:  # the body ours sends to /predict: a null payload, base64 in JSON
            body = json.dumps({"data": base64.b64encode(bytes(64)).decode()})
            fh.write(f"BODY = {body!r}\n" + HTTP_LOCUSTFILE)
        else:
            fh.write(LOCUSTFILE)
    prefix = os.path.join(tmp, "stats")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.getcwd(), os.path.dirname(os.getcwd()), os.environ.get("PYTHONPATH", "")]
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            lf,
            "--headless",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{max(2, round(duration))}s",  # under ~2 s stock Locust may finish before its users send
            "-H",
            f"http://{target}" if http else target,
            "--csv",
            prefix,
            "--only-summary",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    with open(prefix + "_stats.csv") as fh:
        row = next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")
    if int(row["Request Count"]) == 0:  # its percentiles read "N/A"
        raise SystemExit(f"stock Locust sent no request in {duration:g} s; use a longer --duration")
    return {
        "rps": float(row["Requests/s"]),
        "p50": float(row["50%"]),
        "p99": float(row["99%"]),
        "n": int(row["Request Count"]),
    }


def server_cpu_s() -> dict[int, float]:
    """CPU seconds so far of each `python -m netgain.server` process under this one, by pid."""
    out = {}
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "server" in c.cmdline()[1:3] or any(a.endswith("null_targets.py") for a in c.cmdline()[1:3]):
                t = c.cpu_times()
                out[c.pid] = t.user + t.system
    return out


def bound_by(worker_cpu: float, dropped: int, server_cores: float, servers: int) -> str:
    """Which side limited an overloaded capacity run. The sender loop near one core means the
    worker; drops at the in-flight cap with the sender below that mean answers came back slower
    than it sent: the servers, or the path to them, not the sender (so the figure is a lower bound
    on the worker). The servers' CPU is printed for the reader to judge which; it is not tested."""
    if worker_cpu >= 0.85:
        return "worker"
    if dropped > 0:
        return (
            f"the servers' side (they used >= {server_cores:.1f} cores over {servers}): "
            "a lower bound on the worker"
        )
    return "neither saturated"


def fidelity_row(label: str, rate: float, fid: dict) -> list[object]:
    return [
        label,
        f"target {rate:.0f}/s",
        round(fid["achieved_rps"]),
        f"{(fid['achieved_rps'] / rate - 1) * 100:+.2f} %",
        f"lag p50/p99 {fid['lag_p50_ms']:.3f}/{fid['lag_p99_ms']:.3f} ms",
        f"KS {fid['ks']:.4f}",
    ]


def servers(
    stack: contextlib.ExitStack, protocol: str, count: int, canned: bool, cpus: str | None = None
) -> str:
    """Fresh null servers for ``protocol``: netgain's null model over gRPC (``canned``: canned gRPC
    ones), or canned HTTP ones."""
    if protocol == "netgain" and not canned:
        return null_servers(stack, count, free_port(), max_queue=100000, separate=True)
    return canned_servers(stack, count, grpc=protocol == "netgain", cpus=cpus)


def measure(a: argparse.Namespace, protocol: str, tmp: str, rows: list[list[object]]) -> tuple[dict, dict]:
    """Capacity (each --workers count), stock Locust, scaling, then fidelity (and for gRPC accuracy)
    on fresh servers, for one protocol; its rows go to ``rows``. Returns (results by workers, stock)."""
    fractions = [float(x) for x in a.fractions.split(",")]
    rates = [float(x) for x in a.rates.split(",") if x]
    extra = protocol_args(protocol, tmp)
    http = protocol != "netgain"
    name = f"netgain load {protocol}" if http else "netgain load"
    results: dict[int, dict] = {}
    with contextlib.ExitStack() as stack:
        target = servers(stack, protocol, a.servers, a.canned, a.server_cpus)
        for w in (int(x) for x in a.workers.split(",")):
            # Overloaded on purpose: the cap keeps greenlets from piling up past what the server
            # answers, so the measured send rate is the generator's, not a backlog's.
            cpu0, t0 = server_cpu_s(), time.monotonic()
            out = os.path.join(tmp, f"{protocol}-cap{w}")
            r = ours(target, out, a.overload_rate * w, a.duration, w, in_flight=2000, extra=extra)
            cpu1, wall = server_cpu_s(), time.monotonic() - t0
            # Averaged over the whole load command, its start-up included: a lower bound on the
            # servers' CPU while the traffic ran.
            cores = sum(cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1) / wall
            results[w] = r
            rows.append(
                [
                    "capacity (open loop, overloaded)",
                    f"{name} x{w}",
                    round(r["achieved_rps"]),
                    f"{r['achieved_rps'] / w:.0f}/worker",
                    # CPU per request: robust to a shared host where wall-clock rates are not
                    # (gRPC's own C threads are not in the loop's figure; an HTTP sender has none).
                    f"sender loop CPU max {r['worker_cpu_max']:.2f} "
                    f"(~{r['worker_cpu_max'] / max(r['achieved_rps'] / w, 1e-9) * 1e6:.0f} us/request)",
                    f"dropped at cap {r['dropped']}; bound by "
                    + bound_by(r["worker_cpu_max"], r["dropped"], cores, a.servers),
                ]
            )
        # One server carries stock Locust's closed loop.
        stock = stock_locust(target.split(",")[0], 10, a.duration, http=http)
        client = "stock Locust FastHttpUser x1" if http else "stock Locust x1"
        rows.append(["capacity (closed loop, 10 users)", client, round(stock["rps"]), "-", "-", "-"])
        one = results[min(results)]["achieved_rps"]
        if len(results) > 1:
            rows.append(
                [
                    "scaling",
                    f"{protocol} x{max(results)} / x{min(results)}",
                    f"{results[max(results)]['achieved_rps'] / one:.2f}x",
                    "-",
                    "-",
                    "-",
                ]
            )
    leftover = [" ".join(c.cmdline()[-3:]) for c in psutil.Process().children(recursive=True)]
    if leftover:
        print(f"still running after the capacity runs: {leftover}", flush=True)
    # Fidelity on fresh servers: after the overload runs, one H200 run showed send lag of hundreds
    # of ms at 60 % that a run without them did not (2.8 ms p99), so nothing is carried over.
    with contextlib.ExitStack() as stack:
        target = servers(stack, protocol, a.servers, a.canned, a.server_cpus)
        # Fidelity at each fraction of one worker's capacity; the last fraction also serves accuracy.
        fid: dict = {}
        label = f"{protocol} fidelity" if http else "fidelity"
        for frac in fractions:
            out = os.path.join(tmp, f"{protocol}-fid{frac:g}")
            fid = ours(target, out, frac * one, a.duration, 1, extra=extra)
            rows.append(fidelity_row(f"{label} @{frac * 100:.0f}% of one worker", frac * one, fid))
        for rate in rates:
            r = ours(target, os.path.join(tmp, f"{protocol}-rate{rate:g}"), rate, a.duration, 1, extra=extra)
            rows.append(fidelity_row(f"{label} @{rate / one * 100:.0f}% (fixed rate)", rate, r))
        if http or a.canned:  # a canned server's Server-Timing is no measurement to check against
            return results, stock
        # Accuracy: percentiles of our service time and stock Locust's against the server's own totals.
        srv = fid["server_ms"]
        for q in (50, 99):
            s = quantile(srv, q / 100)
            o = quantile(fid["service_ms"], q / 100)
            rows.append(
                [
                    f"accuracy p{q}",
                    f"server span {s:.3f} ms",
                    f"ours {o:.3f} ms",
                    f"ours-server {o - s:+.3f} ms",
                    f"stock Locust {stock['p50' if q == 50 else 'p99']:.0f} ms",
                    "stock rounds to ms",
                ]
            )
    return results, stock


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--workers", default="1,8")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--overload-rate", type=float, default=6000.0, help="per worker, above its capacity")
    ap.add_argument(
        "--fractions",
        default="0.8",
        help="fidelity runs at these fractions of one worker's measured capacity (comma list); "
        "accuracy is read from the last",
    )
    ap.add_argument(
        "--rates",
        default="",
        help="also run fidelity at these fixed rates in req/s (comma list), after the fractions",
    )
    ap.add_argument(
        "--protocols",
        default="netgain",
        help="comma list of netgain (gRPC), oip-http, http-json: each measured in turn",
    )
    ap.add_argument(
        "--canned",
        action="store_true",
        help="gRPC against canned servers (benchmarks/null_targets.py) as HTTP is, not netgain serve",
    )
    ap.add_argument("--server-cpus", default=None, help="canned servers on these cores (taskset list)")
    ap.add_argument(
        "--load-cpus", default=None, help="this script and the load generator it starts on these cores"
    )
    a = ap.parse_args()
    if a.load_cpus:  # the load generator's processes inherit it
        os.sched_setaffinity(0, {int(c) for c in a.load_cpus.split(",")})
    print(
        f"placement: servers on {a.server_cpus or 'any core'}, load generator on {a.load_cpus or 'any core'}"
    )
    tmp = tempfile.mkdtemp()
    rows: list[list[object]] = []
    summary: dict[str, dict] = {}
    for protocol in a.protocols.split(","):
        if protocol not in ("netgain", "oip-http", "http-json"):
            raise SystemExit(f"--protocols: unknown {protocol!r}")
        results, stock = measure(a, protocol, tmp, rows)
        summary[protocol] = {
            "per_worker_rps": {w: r["achieved_rps"] / w for w, r in results.items()},
            "stock_locust": stock,
        }
    print(table(rows, ["check", "setup", "result", "ratio", "detail", "detail"]))
    print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
