"""Frontend capacity: the null model behind N server processes sharing one port (SO_REUSEPORT).

Target (issue 2, H200 host, 16 cores): >= 10,000 req/s; p99 <= 5 ms at half that rate.
Usage: python benchmarks/bench_frontend.py --servers 8,12 --client-procs 4 [--duration 5]
(one row per server count, each with its own fresh servers)
"""

from __future__ import annotations

import argparse
import contextlib

from common import null_servers, run_clients, table

from netgain.experiments.orchestrate import free_port


def measure(servers: int, a: argparse.Namespace) -> list[object]:
    """Saturated closed loop, then paced at half that rate, against ``servers`` fresh processes."""
    with contextlib.ExitStack() as stack:
        target = null_servers(stack, servers, free_port())
        sat = run_clients(
            target, "null", processes=a.client_procs, concurrency=a.concurrency, duration=a.duration
        )
        half = a.paced_rate or sat.rps / 2
        paced = run_clients(
            target,
            "null",
            processes=a.client_procs,
            concurrency=a.concurrency,
            duration=a.duration,
            rate=half,
        )
    return [
        servers,
        a.client_procs,
        round(sat.rps),
        f"{sat.pct(99):.2f}",
        round(half),
        round(paced.rps),
        f"{paced.pct(50):.2f}",
        f"{paced.pct(99):.2f}",
        sat.errors + paced.errors,
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", default="1", help="server process counts, comma-separated")
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument(
        "--paced-rate", type=float, default=0.0, help="paced run's rate (default: half of saturated)"
    )
    a = ap.parse_args()
    rows = [measure(int(n), a) for n in a.servers.split(",")]
    print(
        table(
            rows,
            [
                "servers",
                "client procs",
                "saturated req/s",
                "p99 ms sat",
                "paced rate",
                "achieved",
                "p50 ms paced",
                "p99 ms paced",
                "errors",
            ],
        )
    )


if __name__ == "__main__":
    main()
