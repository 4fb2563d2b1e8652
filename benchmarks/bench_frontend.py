"""Frontend capacity: the null model behind N server processes sharing one port (SO_REUSEPORT).

Target (issue 2, H200 host, 16 cores): >= 10,000 req/s; p99 <= 5 ms at half that rate.
Usage: python benchmarks/bench_frontend.py --servers 6 --client-procs 6 [--duration 5]
"""

from __future__ import annotations

import argparse
import contextlib

from common import null_servers, run_clients, table

from loadgen.orchestrate import free_port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    a = ap.parse_args()
    port = free_port()
    rows = []
    with contextlib.ExitStack() as stack:
        target = null_servers(stack, a.servers, port)
        sat = run_clients(
            target, "null", processes=a.client_procs, concurrency=a.concurrency, duration=a.duration
        )
        half = sat.rps / 2
        paced = run_clients(
            target,
            "null",
            processes=a.client_procs,
            concurrency=a.concurrency,
            duration=a.duration,
            rate=half,
        )
        rows.append(
            [
                a.servers,
                a.client_procs,
                round(sat.rps),
                f"{sat.pct(99):.2f}",
                round(half),
                round(paced.rps),
                f"{paced.pct(50):.2f}",
                f"{paced.pct(99):.2f}",
                sat.errors + paced.errors,
            ]
        )
    print(
        table(
            rows,
            [
                "servers",
                "client procs",
                "saturated req/s",
                "p99 ms sat",
                "half rate",
                "achieved",
                "p50 ms @half",
                "p99 ms @half",
                "errors",
            ],
        )
    )


if __name__ == "__main__":
    main()
