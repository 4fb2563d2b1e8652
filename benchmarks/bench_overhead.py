"""Instrumentation overhead: spans and metrics on vs off, side by side, null and image models.

Targets (issue 2): <= 2 % throughput lost at saturation, <= 20 us added p50.
Usage: python benchmarks/bench_overhead.py [--device cpu|cuda] [--duration 5] [--trials 2] [--side-by-side]

Sequential trials (the default) compare runs seconds apart; on a shared host that drift was as
large as the effect (+-10 % between trials of the same setting). ``--side-by-side`` runs both
servers at once on disjoint cores, swapping the cores every trial, and takes p50 (one request at
a time) from one client that sends to the two servers in turn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from concurrent.futures import ThreadPoolExecutor

import psutil
from common import LoadResult, RoleUsage, pinned, run_alternating, run_clients, split_cpus, table, tree_usage

from netgain.experiments.orchestrate import ServerProcess
from netgain.stats.quantiles import median

# req/s, p50 s, server CPU us per request, client cores busy, that CPU by role
Trial = tuple[float, float, float, float, dict[str, float]]

MODELS = {
    "null": ["--max-batch-size", "32"],
    "image": ["--max-batch-size", "32", "--handler-option", "size=64"],
}


def by_role(trials_on: list[dict[str, float]], trials_off: list[dict[str, float]]) -> str:
    """Paired added us per request, median over trials, for each role that ran."""
    pairs = list(zip(trials_on, trials_off, strict=True))
    roles = sorted({r for on, off in pairs for r in (*on, *off)})
    added = {r: statistics.median(on.get(r, 0.0) - off.get(r, 0.0) for on, off in pairs) for r in roles}
    return ", ".join(f"{r} {v:+.1f}" for r, v in added.items())


def measure(
    model: str,
    device: str,
    instrumented: bool,
    duration: float,
    procs: int,
    conc: int,
    cpus: tuple[set[int] | None, set[int] | None],
    workers: str = "0",
    rate: float = 0.0,
) -> Trial:
    args = ["--model", model, "--device", device, "--pre-threads", "4", "--workers", workers, *MODELS[model]]
    if not instrumented:
        args.append("--no-instrumentation")
    opts = ["size=64"] if model == "image" else []
    with pinned(cpus[0]), ServerProcess(args) as server:
        server.wait_ready()
        sat, roles = loaded(server, cpus[1], model, procs, conc, duration, rate, opts)
        with pinned(cpus[1]):
            one = run_clients(
                server.target, model, processes=1, concurrency=1, duration=duration / 2, options=opts
            )
    return sat.rps, one.pct(50), sum(roles.values()), sat.client_cores, roles


def loaded(
    server: ServerProcess,
    client_cpus: set[int] | None,
    model: str,
    procs: int,
    conc: int,
    duration: float,
    rate: float,
    opts: list[str],
) -> tuple[LoadResult, dict[str, float]]:
    """The clients' run against ``server`` and the server's CPU per call answered, by role: every call
    counts, the warm-up's included, as the CPU window holds them all (estimating the count from the
    measured rate let a trial's start-up skew it). Server CPU per request is far steadier than
    throughput when clients share the cores."""
    proc = psutil.Process(server.pid)
    before = tree_usage(proc)
    # pinned() sets this thread's mask, which the client processes it starts inherit.
    with pinned(client_cpus):
        sat = run_clients(
            server.target,
            model,
            processes=procs,
            concurrency=conc,
            duration=duration,
            rate=rate,
            options=opts,
        )
    after = tree_usage(proc)
    used = {r: (u - before.get(r, RoleUsage())).cpu_s for r, u in after.items()}
    return sat, {r: s / max(1, sat.answered) * 1e6 for r, s in used.items()}


def side_by_side_cpus(server_share: int) -> list[tuple[set[int], set[int]]] | None:
    """Two disjoint (server cores, client cores) sets, or None when the host has too few cores."""
    cores = sorted(os.sched_getaffinity(0))
    if server_share <= 0 or len(cores) < 4 * server_share:
        return None
    half = (len(cores) - 2 * server_share) // 2
    clients = cores[2 * server_share :]
    return [
        (set(cores[:server_share]), set(clients[:half])),
        (set(cores[server_share : 2 * server_share]), set(clients[half : 2 * half])),
    ]


def measure_side_by_side(
    model: str,
    device: str,
    duration: float,
    procs: int,
    conc: int,
    sets: list[tuple[set[int], set[int]]],
    workers: str = "0",
    rate: float = 0.0,
) -> dict[bool, Trial]:
    """On and off at the same time, each server and its clients on their own cores (``sets[0]``
    for instrumentation on): whatever else the host does in that window hits both alike."""
    opts = ["size=64"] if model == "image" else []
    with contextlib.ExitStack() as stack:
        servers = {}
        for instr, (server_cpus, _) in zip((True, False), sets, strict=True):
            args = ["--model", model, "--device", device, "--pre-threads", "4", "--workers", workers]
            args += MODELS[model]
            if not instr:
                args.append("--no-instrumentation")
            with pinned(server_cpus):
                servers[instr] = stack.enter_context(ServerProcess(args))
        for sp in servers.values():
            sp.wait_ready()

        def load(instr: bool, client_cpus: set[int]) -> tuple[float, dict[str, float], float]:
            sat, roles = loaded(servers[instr], client_cpus, model, procs, conc, duration, rate, opts)
            return sat.rps, roles, sat.client_cores

        with ThreadPoolExecutor(2) as ex:
            futures = {
                instr: ex.submit(load, instr, cc) for instr, (_, cc) in zip((True, False), sets, strict=True)
            }
            saturated = {instr: f.result() for instr, f in futures.items()}
        # p50 at one request at a time: one client sends to on and off in turn, so both are
        # measured at the same moments (two separate one-client runs differed by ~80 us either way).
        with pinned(sets[0][1]):
            on_ms, off_ms = run_alternating(
                [servers[True].target, servers[False].target], model, duration=duration, options=opts
            )
        p50 = {True: median(on_ms), False: median(off_ms)}
        return {
            instr: (
                saturated[instr][0],
                p50[instr],
                sum(saturated[instr][1].values()),
                saturated[instr][2],
                saturated[instr][1],
            )
            for instr in (True, False)
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--models", default="null,image")
    ap.add_argument(
        "--server-cores",
        type=int,
        default=4,
        help="pin the server to this many cores and the clients to the rest (0: no pinning; "
        "skipped when the host has fewer than twice as many)",
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="run on and off at the same time on disjoint cores (needs 4x --server-cores cores); "
        "the two core sets swap every trial",
    )
    ap.add_argument(
        "--workers", default="0", help="netgain serve --workers (server CPU counts every process of it)"
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="pace each server at this many req/s in all (0: as fast as the clients go); at one "
        "rate both servers do the same work per second, so CPU per request compares like for like",
    )
    a = ap.parse_args()
    cpus = split_cpus(a.server_cores)
    pairs = side_by_side_cpus(a.server_cores) if a.side_by_side else None
    if a.side_by_side and pairs is None:
        raise SystemExit(f"--side-by-side needs {4 * a.server_cores} cores; this host has {os.cpu_count()}")
    if pairs:
        print(f"side by side: cores {[(sorted(s), sorted(c)) for s, c in pairs]}")
    elif cpus[0]:
        print(f"server on cores {sorted(cpus[0])}, clients on {sorted(cpus[1] or ())}")
    rows = []
    for model in a.models.split(","):
        res: dict[bool, list[Trial]] = {True: [], False: []}
        # Paired trials, on/off order alternating, so drift and order hit both sides alike.
        for trial in range(a.trials):
            if pairs:
                sets = pairs if trial % 2 == 0 else pairs[::-1]
                both = measure_side_by_side(
                    model, a.device, a.duration, a.client_procs, a.concurrency, sets, a.workers, a.rate
                )
                for instr in (True, False):
                    res[instr].append(both[instr])
            else:
                for instr in (True, False) if trial % 2 == 0 else (False, True):
                    res[instr].append(
                        measure(
                            model,
                            a.device,
                            instr,
                            a.duration,
                            a.client_procs,
                            a.concurrency,
                            cpus,
                            a.workers,
                            a.rate,
                        )
                    )
            on, off = res[True][-1], res[False][-1]
            print(
                f"{model} trial {trial + 1}: req/s off {off[0]:.0f} on {on[0]:.0f} "
                f"lost {(1 - on[0] / off[0]) * 100:+.2f} %, CPU/req off {off[2]:.0f} on {on[2]:.0f} us, "
                f"p50 off {off[1] * 1e3:.0f} on {on[1] * 1e3:.0f} us, "
                f"client cores busy off {off[3]:.2f} on {on[3]:.2f}; added CPU/req by role "
                f"{by_role([on[4]], [off[4]])} us",
                flush=True,
            )
        paired = sorted((1 - on[0] / off[0]) * 100 for on, off in zip(res[True], res[False], strict=True))
        added = sorted(on[2] - off[2] for on, off in zip(res[True], res[False], strict=True))
        on_rps = statistics.median(r[0] for r in res[True])
        off_rps = statistics.median(r[0] for r in res[False])
        on_p50 = statistics.median(r[1] for r in res[True])
        off_p50 = statistics.median(r[1] for r in res[False])
        on_cpu = statistics.median(r[2] for r in res[True])
        off_cpu = statistics.median(r[2] for r in res[False])
        rows.append(
            [
                model,
                a.device,
                round(off_rps),
                round(on_rps),
                f"{(1 - on_rps / off_rps) * 100:+.2f} %",
                f"{statistics.median(paired):+.2f} % ({paired[0]:+.1f}..{paired[-1]:+.1f})",
                f"{off_p50 * 1e3:.0f}",
                f"{on_p50 * 1e3:.0f}",
                f"{(on_p50 - off_p50) * 1e3:+.0f}",
                f"{off_cpu:.0f}",
                f"{on_cpu:.0f}",
                f"{(on_cpu / off_cpu - 1) * 100:+.1f} %",
                f"{statistics.median(added):+.1f} ({added[0]:+.0f}..{added[-1]:+.0f})",
                by_role([r[4] for r in res[True]], [r[4] for r in res[False]]),
            ]
        )
    print(
        table(
            rows,
            [
                "model",
                "device",
                "req/s off",
                "req/s on",
                "throughput lost",
                "paired: median (range)",
                "p50 us off",
                "p50 us on",
                "added p50 us",
                "server CPU us/req off",
                "on",
                "added CPU",
                "paired added us/req: median (range)",
                "by role: median",
            ],
        )
    )


if __name__ == "__main__":
    main()
