"""Instrumentation cost in instructions per request, counted by valgrind's cachegrind.

Throughput on a shared host moves by +-5 % between trials of one setting, more than the effect
being looked for; instruction counts do not. The null-model server runs under cachegrind with
instrumentation on and off, twice each (K1 and K2 requests at concurrency 64, full batches of
32), and (I(K2) - I(K1)) / (K2 - K1) is its cost per request with start-up and shutdown cancelled.
The recorder drains every 2 s here, as it would hold a few hundred requests per drain at full
speed; BLAS threads are held to one, as their spinning depends on timing, not on requests, and
the string hash is fixed (PYTHONHASHSEED=0), as dict probing depends on it.

An instruction count leaves out what instrumentation costs in contention (the GIL, caches) and on
the client, so it bounds the server's own work, not the throughput lost: the side-by-side
benchmark (bench_overhead.py) measures that.

With ``--workers N`` the server runs as ``netgain serve --workers N`` (a supervisor, N frontends,
``--pre-processes`` pre-processing processes and the device process, all forked without exec):
cachegrind follows the forks and writes one file per process (DIR/on.K/cg.PID), the processes are
summed, and each is also reported by role (frontend, pre-processing, device, supervisor), read
from the OS name each child gives its main thread (``ng-front-0``, ``ng-pre-1``, ``ng-device``)
while the server runs. A forked child's count starts with its parent's count at the fork; that
start-up part cancels in the difference like the rest.

Instructions are no time: ``--cpu-requests N`` also runs the uninstrumented server natively
(``--cpu-trials`` times, N requests each) and reads the CPU all its processes spend per request,
which gives the server's own instructions per µs to convert the added count with: per µs of user
time (cachegrind counts user-mode instructions) and, charging each a share of the kernel's time
too, per µs of user + system time.

Usage: python benchmarks/bench_instructions.py [--requests 1000,5000] [--out DIR]
       python benchmarks/bench_instructions.py --workers 1 [--pre-processes 1] [--cpu-requests 20000]
Needs valgrind; about 2-3 minutes per server on a 2-core machine (one process or --workers 1).
Where the difference goes: cg_diff DIR/cg.off.K2 DIR/cg.on.K2 > d; cg_annotate d | head -60
(--workers: cg_diff DIR/off.K2/cg.PID DIR/on.K2/cg.PID, one process of a role against its peer;
DIR/off.K2/roles.json names each PID's role)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from common import role_of, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_ARGS = [
    "--model", "null", "--port", "0", "--metrics-port", "-1", "--max-batch-size", "32",
    "--max-queue-delay-ms", "100", "--intra-op-threads", "1", "--sample-interval-s", "30",
    "--recorder-interval-s", "2",
]  # fmt: skip


async def _drive(port: int, count: int, concurrency: int) -> None:
    import grpc

    from netgain.loadgen.payloads import PayloadFactory
    from netgain.protos.service import SERVICE_NAME

    body = PayloadFactory("null", {}).request_bytes(0, 0, 1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary(f"/{SERVICE_NAME}/Infer")
        deadline = time.monotonic() + 600
        while True:  # warming up under valgrind takes a while: UNAVAILABLE until SERVING
            try:
                await infer(body, timeout=60)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        left = count

        async def user(k: int) -> None:
            nonlocal left
            i = 0
            while left > 0:
                left -= 1
                i += 1
                await infer(body, metadata=(("x-request-id", f"c{k}-{i}"),), timeout=120)

        await asyncio.gather(*(user(k) for k in range(concurrency)))


def serve_args(instrumented: bool, ports: str, workers: int, pre: int) -> list[str]:
    args = [*SERVER_ARGS, "--ports-file", ports]
    if workers:
        args += ["--workers", str(workers), "--pre-processes", str(pre)]
    return args if instrumented else [*args, "--no-instrumentation"]


def server_cmd(instrumented: bool, cg_out: str, ports: str, workers: int, pre: int) -> list[str]:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={cg_out}"]
    if workers:  # forks are followed without asking; exec'd helpers are counted too, as "other"
        cmd.append("--trace-children=yes")
    return [*cmd, sys.executable, "-m", "netgain.server", *serve_args(instrumented, ports, workers, pre)]


@contextlib.contextmanager
def serving(cmd: list[str], ports: str, log_path: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The server started by ``cmd`` (it writes ``ports``) and its gRPC port; SIGTERM at the end."""
    # A fixed string hash: how long dict and set lookups probe, and so the count, depends on it.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT, PYTHONHASHSEED="0")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 600
            while not os.path.exists(ports):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start; see {log_path}")
                time.sleep(0.5)
            time.sleep(0.2)  # the file is written in one go, but give the writer a moment
            with open(ports) as fh:
                yield proc, int(json.load(fh)["grpc"])
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(600)


def child_roles(parent: int) -> dict[int, str]:
    """pid -> role of the server's children, from the OS name each gives its main thread."""
    roles: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        roles[int(entry)] = role_of(comm, "other")
    return roles


def summary(path: str) -> int:
    with open(path) as fh:
        found = [line for line in fh if line.startswith("summary:")]
    if not found:
        raise SystemExit(f"no cachegrind summary in {path}")
    return int(found[-1].split()[1])


def by_role(run_dir: str, roles: dict[int, str], supervisor: int) -> dict[str, int]:
    """Instructions per role over every process's file in ``run_dir`` (cg.PID)."""
    out: dict[str, int] = {}
    names = sorted(n for n in os.listdir(run_dir) if n.startswith("cg."))
    missing = [f"{pid} ({role})" for pid, role in sorted(roles.items()) if f"cg.{pid}" not in names]
    if missing:  # killed before valgrind wrote its counts: the sum would be short
        raise SystemExit(f"no cachegrind file in {run_dir} for process {', '.join(missing)}")
    for name in names:
        pid = int(name[3:])
        role = "supervisor" if pid == supervisor else roles.get(pid, "other")
        out[role] = out.get(role, 0) + summary(os.path.join(run_dir, name))
    return out


def count_instructions(
    instrumented: bool, requests: int, out_dir: str, concurrency: int, workers: int = 0, pre: int = 0
) -> dict[str, int]:
    """Instructions of one server run: {"server": n}, or with ``workers`` per role."""
    tag = f"{'on' if instrumented else 'off'}.{requests}"
    ports = os.path.join(out_dir, f"ports.{tag}.json")
    run_dir = os.path.join(out_dir, tag)
    if workers:
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
    cg_out = os.path.join(run_dir, "cg.%p") if workers else os.path.join(out_dir, f"cg.{tag}")
    cmd = server_cmd(instrumented, cg_out, ports, workers, pre)
    roles: dict[int, str] = {}
    with serving(cmd, ports, os.path.join(out_dir, f"valgrind.{tag}.log")) as (proc, port):
        asyncio.run(_drive(port, requests, concurrency))
        if workers:
            roles = child_roles(proc.pid)  # valgrind runs the program in its own process: same pid
    if not workers:
        return {"server": summary(cg_out)}
    if not {"frontend", "device"} | ({"pre-processing"} if pre else set()) <= set(roles.values()):
        raise SystemExit(f"could not tell the server's processes apart: {roles}")
    with open(os.path.join(run_dir, "roles.json"), "w") as fh:  # which cg.PID to give cg_diff
        json.dump({"supervisor": proc.pid, **{str(pid): role for pid, role in roles.items()}}, fh)
    return by_role(run_dir, roles, proc.pid)


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(user, user + system) seconds of these processes so far (/proc)."""
    user = system = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])  # utime, stime: stat's 14th, 15th
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, (user + system) / tick


def cpu_per_request(
    requests: int, out_dir: str, concurrency: int, workers: int, pre: int, trial: int
) -> tuple[float, float]:
    """(user, user + system) µs of CPU per request of the uninstrumented server run natively, all
    its processes, after a warm-up of 1,000 requests."""
    ports = os.path.join(out_dir, f"ports.native.{trial}.json")
    cmd = [sys.executable, "-m", "netgain.server", *serve_args(False, ports, workers, pre)]
    with serving(cmd, ports, os.path.join(out_dir, f"native.{trial}.log")) as (proc, port):
        asyncio.run(_drive(port, 1000, concurrency))
        pids = [proc.pid, *child_roles(proc.pid)]
        before = cpu_seconds(pids)
        asyncio.run(_drive(port, requests, concurrency))
        after = cpu_seconds(pids)
        return ((after[0] - before[0]) / requests * 1e6, (after[1] - before[1]) / requests * 1e6)


def report_rate(off: float, added: float, cpu: list[tuple[float, float]]) -> str:
    """The added instructions in µs at the uninstrumented server's own rate (median trial): the
    count is of user-mode instructions, so user time is the rate to convert it with; all CPU
    charges each instruction a share of the kernel's time too."""
    user = sorted(c[0] for c in cpu)[len(cpu) // 2]
    total = sorted(c[1] for c in cpu)[len(cpu) // 2]
    trials = ", ".join(f"{c[1]:.0f} ({c[0]:.0f})" for c in cpu)
    return (
        f"off, run natively: {trials} µs of CPU (user) per request, all processes; "
        f"{off / user:,.0f} instructions per µs of user time, {off / total:,.0f} per µs of CPU (median); "
        f"the added {added:+,.0f} instructions ≈ {added / (off / user):+.1f} µs of user time, "
        f"{added / (off / total):+.1f} µs at the all-CPU rate"
    )


def role_order(role: str) -> int:
    order = ["server", "frontend", "pre-processing", "device", "supervisor", "other", "all"]
    return order.index(role) if role in order else len(order)


def run_repeat(a: argparse.Namespace, k1: int, k2: int, out_dir: str, r: int) -> dict[bool, dict[str, float]]:
    """One repeat: off and on at K1, then at K2 (on first in odd repeats, so a drift in the host's
    load falls on both sides), and each side's instructions per request by process."""
    os.makedirs(out_dir, exist_ok=True)
    counts: dict[tuple[bool, int], dict[str, int]] = {}
    for k in (k1, k2):
        for instrumented in (True, False) if r % 2 else (False, True):
            counts[instrumented, k] = count_instructions(
                instrumented, k, out_dir, a.concurrency, a.workers, a.pre_processes
            )
            total = sum(counts[instrumented, k].values())
            print(f"{'on' if instrumented else 'off'} {k} requests: {total:,} instructions", flush=True)
    out: dict[bool, dict[str, float]] = {}
    for instrumented in (False, True):
        low, high = counts[instrumented, k1], counts[instrumented, k2]
        side = {role: (high.get(role, 0) - low.get(role, 0)) / (k2 - k1) for role in set(low) | set(high)}
        out[instrumented] = {**side, "all": sum(side.values())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="1000,5000", help="K1,K2: requests per run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="netgain serve --workers N (0: one process)")
    ap.add_argument(
        "--pre-processes", type=int, default=1, help="with --workers: netgain serve --pre-processes"
    )
    ap.add_argument("--out", default="", help="keep cachegrind's files here (default: a temp dir)")
    ap.add_argument(
        "--cpu-requests",
        type=int,
        default=0,
        help="also time N requests of the uninstrumented server run natively (--cpu-trials times): "
        "CPU per request, to convert instructions to µs (0: skip)",
    )
    ap.add_argument("--cpu-trials", type=int, default=3)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the four counts this many times (DIR/rN each) and report medians: a count's "
        "timing-dependent part (event-loop and gRPC polling rounds) moves with the host's load",
    )
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if a.workers < 0 or a.pre_processes < 0 or a.cpu_requests < 0 or a.cpu_trials < 1 or a.repeats < 1:
        raise SystemExit(
            "--workers, --pre-processes and --cpu-requests must be 0 or more, "
            "--cpu-trials and --repeats 1 or more"
        )
    try:
        k1, k2 = (int(x) for x in a.requests.split(","))
    except ValueError:
        raise SystemExit(f"--requests {a.requests!r}: expected K1,K2 (two integers)") from None
    if not 0 < k1 < k2:
        raise SystemExit("--requests K1,K2 needs 0 < K1 < K2")
    out_dir = a.out or tempfile.mkdtemp(prefix="netgain-cg-")
    os.makedirs(out_dir, exist_ok=True)
    reps = [
        run_repeat(a, k1, k2, out_dir if a.repeats == 1 else os.path.join(out_dir, f"r{r}"), r)
        for r in range(a.repeats)
    ]
    roles = sorted({role for rep in reps for side in rep.values() for role in side}, key=role_order)
    off = {role: statistics.median(rep[False].get(role, 0.0) for rep in reps) for role in roles}
    on = {role: statistics.median(rep[True].get(role, 0.0) for rep in reps) for role in roles}
    added = {role: [rep[True].get(role, 0.0) - rep[False].get(role, 0.0) for rep in reps] for role in roles}
    if not a.workers:
        o, n = off["server"], on["server"]
        print(
            table(
                [[f"{o:,.0f}", f"{n:,.0f}", f"{n - o:+,.0f}", f"{(n / o - 1) * 100:+.1f} %"]],
                ["off: instructions/request", "on", "added", "added share"],
            )
        )
    else:
        rows = [
            [role, f"{off[role]:,.0f}", f"{on[role]:,.0f}", f"{statistics.median(added[role]):+,.0f}"]
            for role in roles
        ]
        print(f"--workers {a.workers} --pre-processes {a.pre_processes}, instructions per request:")
        print(table(rows, ["process", "off", "on", "added"]))
    if a.repeats > 1:
        print(f"medians of {a.repeats} repeats; added in each, by process:")
        for role in roles:
            print(f"  {role}: {', '.join(f'{x:+,.0f}' for x in added[role])}")
    if a.cpu_requests:
        cpu = [
            cpu_per_request(a.cpu_requests, out_dir, a.concurrency, a.workers, a.pre_processes, t)
            for t in range(a.cpu_trials)
        ]
        print(report_rate(off["all"], statistics.median(added["all"]), cpu))
    print(f"cachegrind files in {out_dir}")


if __name__ == "__main__":
    main()
