"""Shared pieces of the benchmarks: a fast closed-loop grpc.aio client run in child processes.

Benchmarks print ratios of things measured side by side in one run; absolute numbers
depend on the host and are printed for context only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Benchmarks start the server inside one ``pinned`` block and the clients inside another, so the
# two never share a core and scheduler placement stops being a source of run-to-run noise.
from netgain.experiments.orchestrate import pinned as pinned


@dataclass
class LoadResult:
    ok: int
    errors: int
    seconds: float
    latencies_ms: np.ndarray
    items: int
    client_cpu_s: float = 0.0  # CPU seconds the client processes spent sending and receiving
    answered: int = 0  # calls answered, warm-up and errors included: the server's whole work

    @property
    def client_cores(self) -> float:
        """Cores the clients kept busy over the run (warm-up included): near the cores they were
        given means the clients, not the server, set the pace."""
        return self.client_cpu_s / self.seconds

    @property
    def rps(self) -> float:
        return self.ok / self.seconds

    @property
    def items_per_s(self) -> float:
        return self.ok * self.items / self.seconds

    def pct(self, q: float) -> float:
        """The nearest-rank q-th percentile (q in percent) of latency; NaN without any."""
        from netgain.stats.quantiles import quantile

        return quantile(self.latencies_ms, q / 100)


async def _closed_loop(
    target: str,
    body: bytes,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    rate: float,
    connections: int,
) -> dict[str, object]:
    import grpc

    from netgain.protos.service import SERVICE_NAME

    lat: list[float] = []
    errors = 0
    answered = 0
    # One TCP connection per channel (a local subchannel pool): server processes sharing a port
    # through SO_REUSEPORT are chosen per connection, so one connection would load only one.
    opts = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, opts) for _ in range(connections)]
    calls = [ch.unary_unary(f"/{SERVICE_NAME}/Infer") for ch in channels]
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s
    interval = concurrency / rate if rate > 0 else 0.0

    async def user(k: int) -> None:
        nonlocal errors, answered
        nxt = time.perf_counter() + (interval * k / concurrency if interval else 0.0)
        while True:
            if interval:  # paced: each user sends at fixed intended times (open-loop per user)
                delay = nxt - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sched = nxt
                nxt += interval
            else:
                sched = time.perf_counter()
            if sched >= t_end:
                return
            try:
                await calls[k % connections](
                    body, metadata=(("x-request-id", f"b{k}-{len(lat)}"),), timeout=30
                )
                ok = True
            except grpc.aio.AioRpcError:
                ok = False
            done = time.perf_counter()
            answered += 1
            if sched >= t_measure:
                if ok:
                    lat.append((done - sched) * 1e3)
                else:
                    errors += 1

    await asyncio.gather(*(user(k) for k in range(concurrency)))
    cpu_s = (time.process_time() - cpu_start) * duration_s / (time.perf_counter() - t_start)
    for ch in channels:
        await ch.close()
    return {"lat": lat, "errors": errors, "seconds": duration_s, "cpu_s": cpu_s, "answered": answered}


async def _alternating(
    targets: list[str], body: bytes, duration_s: float, warmup_s: float
) -> dict[str, object]:
    """One request at a time, to each target in turn: each pair of requests sees the same moment
    of the host, so a latency difference between the targets is not drift between runs."""
    import grpc

    from netgain.protos.service import SERVICE_NAME

    channels = [grpc.aio.insecure_channel(t) for t in targets]
    calls = [ch.unary_unary(f"/{SERVICE_NAME}/Infer") for ch in channels]
    lat: list[list[float]] = [[] for _ in targets]
    t_measure = time.perf_counter() + warmup_s
    t_end = t_measure + duration_s
    errors = 0
    n = 0
    while True:
        now = time.perf_counter()
        if now >= t_end:
            break
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            try:
                await call(body, metadata=(("x-request-id", f"a{i}-{n}"),), timeout=30)
            except grpc.aio.AioRpcError:
                errors += now >= t_measure
                continue
            if now >= t_measure:
                lat[i].append((time.perf_counter() - t0) * 1e3)
        n += 1
    for ch in channels:
        await ch.close()
    return {"lat_by_target": lat, "errors": errors, "seconds": duration_s}


def run_alternating(
    targets: list[str], model: str, *, duration: float, warmup: float = 1.0, options: list[str] | None = None
) -> list[np.ndarray]:
    """Latencies (ms) per target from one client process sending to each target in turn."""
    out = os.path.join(tempfile.mkdtemp(), "alt.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--target", ",".join(targets), "--model", model]
    cmd += ["--alternate", "--duration", str(duration), "--warmup", str(warmup), "--out", out]
    for o in options or []:
        cmd += ["--option", o]
    subprocess.run(cmd, check=True)
    with open(out) as fh:
        r = json.load(fh)
    return [np.asarray(x) for x in r["lat_by_target"]]


def client_main() -> None:
    import argparse

    from netgain.loadgen.payloads import PayloadFactory

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--alternate", action="store_true", help="targets (comma-separated) in turn")
    a = ap.parse_args()
    opts = dict(o.split("=", 1) for o in a.option)
    body = PayloadFactory(a.model, opts).request_bytes(0, a.size, a.items)
    if a.alternate:
        alt = asyncio.run(_alternating(a.target.split(","), body, a.duration, a.warmup))
        with open(a.out, "w") as fh:
            json.dump(alt, fh)
        return
    res = asyncio.run(
        _closed_loop(a.target, body, a.concurrency, a.duration, a.warmup, a.rate, a.connections)
    )
    with open(a.out, "w") as fh:
        json.dump(res, fh)


def run_clients(
    target: str,
    model: str,
    *,
    processes: int = 1,
    concurrency: int = 32,
    duration: float = 5.0,
    warmup: float = 1.0,
    items: int = 1,
    size: int = 0,
    rate: float = 0.0,
    options: list[str] | None = None,
) -> LoadResult:
    """Closed-loop (or paced, when ``rate`` > 0, split across processes) aio clients in child processes."""
    tmp = tempfile.mkdtemp()
    procs = []
    for i in range(processes):
        out = os.path.join(tmp, f"c{i}.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--target",
            target,
            "--model",
            model,
            "--concurrency",
            str(concurrency),
            "--duration",
            str(duration),
            "--warmup",
            str(warmup),
            "--items",
            str(items),
            "--size",
            str(size),
            "--rate",
            str(rate / processes if rate else 0.0),
            "--out",
            out,
        ]
        for o in options or []:
            cmd += ["--option", o]
        procs.append((subprocess.Popen(cmd), out))
    lat: list[float] = []
    errors = 0
    cpu_s = 0.0
    answered = 0
    for p, out in procs:
        p.wait()
        with open(out) as fh:
            r = json.load(fh)
        lat += r["lat"]
        errors += r["errors"]
        cpu_s += r.get("cpu_s", 0.0)
        answered += r.get("answered", 0)
    return LoadResult(len(lat), errors, duration, np.asarray(lat), items, cpu_s, answered)


def shared_port_servers(stack: contextlib.ExitStack, count: int, args: list[str], port: int) -> str:
    """One ``netgain serve ARGS --workers count`` on ``port``: ``count`` frontend processes share it
    (only one server may own a port); ready when it returns; returns the target."""
    from netgain.experiments.orchestrate import ServerProcess

    sp = stack.enter_context(ServerProcess([*args, "--workers", str(count)], port=port))
    sp.wait_ready()
    wait_metric_ready(sp.metrics_port, sp.ready_timeout_s)
    return f"127.0.0.1:{port}"


def wait_metric_ready(metrics_port: int, timeout_s: float) -> None:
    """Until ``netgain_ready`` reads 1 on this server's own /metrics (set just before SERVING)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                families = text_string_to_metric_families(r.read().decode())
            ready = (s.value for f in families if f.name == "netgain_ready" for s in f.samples)
            if any(v == 1 for v in ready):
                return
        time.sleep(0.05)
    raise SystemExit(f"server with metrics port {metrics_port} not ready within {timeout_s:.0f} s")


def null_servers(
    stack: contextlib.ExitStack, count: int, port: int, max_queue: int = 4096, separate: bool = False
) -> str:
    """``count`` null-model server processes, ready; returns the target. Sharing ``port`` they are one
    server's frontends (all traffic through its one device process); ``separate``: ``count``
    independent one-process servers on ports of their own, a comma-joined target that the load
    generator spreads requests over (so the servers never bind before a generator under test)."""
    from netgain.experiments.orchestrate import ServerProcess

    args = ["--model", "null", "--max-batch-size", "64", "--max-queue-delay-ms", "0.5", "--max-queue-size",
            str(max_queue)]  # fmt: skip
    if not separate:
        return shared_port_servers(stack, count, args, port)
    servers = [stack.enter_context(ServerProcess([*args, "--workers", "0"])) for _ in range(count)]
    for sp in servers:
        sp.wait_ready()
        wait_metric_ready(sp.metrics_port, sp.ready_timeout_s)
    return ",".join(sp.target for sp in servers)


# The OS names the processes of ``netgain serve --workers`` give their main threads, by role.
ROLES = (("ng-front-", "frontend"), ("ng-pre-", "pre-processing"), ("ng-device", "device"))


def role_of(name: str, other: str) -> str:
    """A server process's role from its OS name (``ng-front-0`` → frontend); ``other`` if none."""
    return next((role for prefix, role in ROLES if name.startswith(prefix)), other)


def involuntary_switches(pid: int) -> int:
    """Times the scheduler took a core from any thread of ``pid`` while it could still run (each
    thread's own count: a process's status file holds its main thread's alone)."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as fh:
                for line in fh:
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    return total


@dataclass
class RoleUsage:
    """What a server's processes of one role used: CPU seconds, involuntary switches, processes."""

    cpu_s: float = 0.0
    involuntary: int = 0
    processes: int = 0

    def __sub__(self, before: RoleUsage) -> RoleUsage:
        return RoleUsage(self.cpu_s - before.cpu_s, self.involuntary - before.involuntary, self.processes)


def tree_usage(proc: Any, other: str = "supervisor") -> dict[str, RoleUsage]:
    """User + system seconds and involuntary switches of a server's process (a ``psutil.Process``)
    and every process under it, by role (``other``: the one process without a role name)."""
    import psutil

    usage: dict[str, RoleUsage] = {}
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            u = usage.setdefault(role_of(p.name(), other), RoleUsage())
            u.cpu_s += sum(p.cpu_times()[:2])
            u.involuntary += involuntary_switches(p.pid)
            u.processes += 1
    return usage


def split_cpus(server_share: int) -> tuple[set[int] | None, set[int] | None]:
    """(server cores, client cores): the first ``server_share`` usable cores and the rest, or
    (None, None) when fewer than twice that many are usable."""
    cores = sorted(os.sched_getaffinity(0))
    if server_share <= 0 or len(cores) < 2 * server_share:
        return None, None
    return set(cores[:server_share]), set(cores[server_share:])


def device_ms(fn: Callable[[], Any], cuda: bool) -> tuple[float, Any]:
    """(milliseconds, result) of ``fn``; on CUDA the device is synchronised before and after, so the
    time is the work's and not a launch's."""
    if cuda:
        import torch

        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, out


def table(rows: list[list[object]], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [
        [f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    client_main()
