"""The server's capacity against the host's ceiling, measured in one run on one host.

Ceilings, on the cores given to the server: pre-processing with one process per core and one
torch thread each, and the forward pass alone at the batch size on the device (the batch
already collated and pinned; copies included, as the server pays them). Then ``netgain serve``
(pinned to those cores) is driven by ``netgain load`` (pinned to the other cores) with Poisson
arrivals at rising rates until p99 exceeds the SLO; capacity is the highest rate that held it
with a valid run and under 0.1 % errors. Prints capacity / ceiling, where the ceiling is
min(pre-processing, forward) on a GPU and, on the CPU, where both stages share the same cores,
1 / (1/pre-processing + 1/forward). With ``--handler-option decode=gpu`` (image, resnet50) the
ceilings follow the work: pre-processing is the header check alone, and the forward ceiling is
nvJPEG decode, resize and forward on the device, for batches of JPEG bytes.

    python benchmarks/bench_ceiling.py --model image --device cuda --server-cores 10 --batch 32
    python benchmarks/bench_ceiling.py --model image --device cuda --handler-option decode=gpu

``--busy-neighbours`` measures the pre-processing ceiling a second time while the load cores run
the same loop, and prints it beside the quiet one: how much a host's shared caches, memory and
clocks slow the work when every core is busy. The targets stay against the quiet ceiling.
After each layout's sweep the pre-processing ceiling is measured again and printed beside the
first: a host's per-core speed can move during a run (a fixed Python loop took 2.0 to 3.7 ms a
few seconds apart on one GPU host), and the two readings bound how far. Each layout's table is
followed by the server's CPU per request (all its processes) at the last step that held, and the
most its cores could carry at that cost: where capacity is CPU-bound, the ratio's upper limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RoleUsage, involuntary_switches, pinned, role_of, table, tree_usage
from netgain.contract.cores import siblings


def _pre_worker(model: str, options: dict[str, str], core: int, seconds: float, out: Any) -> None:
    import torch

    from netgain.server.handlers import create_handler

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    handler = create_handler(model, options, 0)
    rng = random.Random(core)
    inputs = [handler.example_input(rng) for _ in range(16)]
    for x in inputs:
        handler.preprocess(x)
    switched = involuntary_switches(os.getpid())
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        handler.preprocess(inputs[n % len(inputs)])
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.put((n / wall, cpu / max(1, n), (involuntary_switches(os.getpid()) - switched) / wall))


@dataclass
class PreCeiling:
    """Items per second over the cores, and per process: CPU ms per item, involuntary switches/s."""

    items_s: float
    cpu_ms: float
    switches_s: float

    def describe(self) -> str:
        per = "involuntary switches/s per process"
        return f"{self.cpu_ms:.2f} ms of CPU per item, {self.switches_s:.0f} {per}"


def pre_ceiling(model: str, options: dict[str, str], cores: list[int], seconds: float) -> PreCeiling:
    """Items per second pre-processed by one single-threaded process per core, all at once."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_pre_worker, args=(model, options, c, seconds, out)) for c in cores]
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return PreCeiling(
        float(sum(g[0] for g in got)),
        1e3 * statistics.median(g[1] for g in got),
        statistics.median(g[2] for g in got),
    )


def pre_ceiling_beside(
    model: str, options: dict[str, str], cores: list[int], neighbours: list[int], seconds: float
) -> PreCeiling:
    """pre_ceiling on ``cores`` while ``neighbours`` run the same loop, started first and running
    longer, so that they are busy for the whole measurement."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        beside = ex.submit(pre_ceiling, model, options, neighbours, seconds + 15)
        time.sleep(5)  # their imports and warm-up
        measured = pre_ceiling(model, options, cores, seconds)
        beside.result()
    return measured


def _forward_worker(
    model: str, options: dict[str, str], device: str, dtype: str, batch: int, out: Any
) -> None:
    import torch

    from netgain.server.device import DeviceRunner
    from netgain.server.handlers import create_handler

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    handler = create_handler(model, options, 0)
    runner = DeviceRunner(handler, device, dtype)
    runner.place(handler.build_model())
    rng = random.Random(0)
    items = [handler.preprocess(handler.example_input(rng)) for _ in range(batch)]
    data = runner.prepare(handler.collate(items))
    for _ in range(10):
        runner.run(data)
    n, kernel_ns, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < 5.0:
        kernel_ns += runner.run(data).kernel_ns
        n += 1
    elapsed = time.perf_counter() - t0
    out.put({"items_s": n * batch / elapsed, "kernel_items_s": n * batch / max(1e-9, kernel_ns / 1e9)})


def forward_ceiling(
    model: str, options: dict[str, str], device: str, dtype: str, batch: int
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_forward_worker, args=(model, options, device, dtype, batch, out))
    p.start()
    result: dict[str, float] = out.get(timeout=600)
    p.join()
    return result


def shared_cores(server: list[int], load: list[int]) -> list[tuple[int, int]]:
    """(server core, load core) pairs that are SMT siblings of one physical core, from sysfs."""
    return [(c, s) for c in server for s in sorted(siblings(c) or ()) if s in load]


def server_processes(supervisor: int) -> dict[str, int]:
    """The pid of the device process, the first frontend and the first pre-processing process, by
    the names the server gives them (``role_of``)."""
    found: dict[str, int] = {}
    for k in psutil.Process(supervisor).children():
        role = role_of(k.name(), "")
        if role and role not in found:
            found[role] = k.pid
    return found


def spy(pid: int, seconds: float, out: str, gil: bool) -> subprocess.Popen[bytes]:
    cmd = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
           "--format", "raw", "--output", out, "--nonblocking"] + (["--gil"] if gil else [])  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spy_summary(path: str, seconds: float, top: int = 12) -> str:
    """Busy fraction (samples / (seconds x rate)) and the leaf functions taking the most samples."""
    from collections import Counter

    leaves: Counter[str] = Counter()
    total = 0
    try:
        with open(path) as fh:
            for line in fh:
                stack, _, count = line.rstrip().rpartition(" ")
                if not count.isdigit():
                    continue
                n = int(count)
                total += n
                leaves[stack.split(";")[-1]] += n
    except OSError as exc:
        return f"  (no profile: {exc})"
    lines = [f"  samples {total} = {total / (seconds * 200):.2f} of one thread's time"]
    for leaf, n in leaves.most_common(top):
        lines.append(f"  {100 * n / max(1, total):5.1f} %  {leaf[:150]}")
    return "\n".join(lines)


MAX_ERROR_RATIO = 1e-3  # a rate holds with at most 0.1 % of the measured requests failed, as in netgain tune


def run_rate(target: str, a: argparse.Namespace, rate: float, out: str) -> dict[str, Any]:
    from dataclasses import asdict

    from netgain.experiments.tune import load_and_report, trial

    rep = load_and_report(
        target,
        out,
        model=a.model,
        rate=rate,
        duration_s=a.duration,
        warmup_s=a.warmup_s,
        load_workers=a.load_workers,
        connections=a.connections,
        seed=1,
    )
    t = asdict(trial(rep, rate, a.slo_ms, MAX_ERROR_RATIO))
    phases = (rep or {}).get("phases_ms") or {}
    t["phases"] = {k: v.get("p50") for k, v in phases.items() if isinstance(v, dict)}
    t["cpu"] = (rep or {}).get("cpu")
    t["requests"] = int(((rep or {}).get("counts") or {}).get("rows") or 0)  # warm-up included
    tail = ((rep or {}).get("tail") or {}).get("p99") or {}
    t["tail"] = {
        "dominant": tail.get("dominant"),
        "mean_ms": {k: round(v["tail_mean_ms"], 2) for k, v in (tail.get("phases") or {}).items()
                    if v.get("tail_mean_ms") is not None and v["tail_mean_ms"] >= 0.05},
    }  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="image")
    ap.add_argument("--handler-option", action="append", default=[])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--queue-delay-ms", type=float, default=2.0)
    ap.add_argument(
        "--server-cores", type=int, default=10, help="the first N usable cores serve; the rest load"
    )
    ap.add_argument("--pre-threads", type=int, default=2, help="netgain serve --pre-threads")
    ap.add_argument(
        "--variant", action="append", default=[],
        help="netgain serve flags for one sweep, e.g. '--workers 3 --pre-processes 7'; repeat to sweep "
        "several layouts against the same ceilings (default: one sweep with the server's defaults)",
    )  # fmt: skip
    ap.add_argument("--load-workers", type=int, default=0, help="0: one per load core")
    ap.add_argument(
        "--connections",
        type=int,
        default=64,
        help="per load worker: the kernel spreads connections over frontends",
    )
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--start", type=float, default=0.2, help="first rate, as a fraction of the ceiling")
    ap.add_argument("--step", type=float, default=0.1, help="rate step, as a fraction of the ceiling")
    ap.add_argument("--pre-seconds", type=float, default=5.0)
    ap.add_argument(
        "--profile-at", type=float, default=0.0,
        help="py-spy the device process, one frontend and one pre-processing process during the first "
        "rate at or above this fraction of the ceiling (0: no profile)",
    )  # fmt: skip
    ap.add_argument(
        "--busy-neighbours", action="store_true",
        help="measure the pre-processing ceiling again while the load generator's cores run the same "
        "loop (a host's shared caches, memory and clocks under load); reported beside the ceiling, "
        "which stays the quiet one",
    )  # fmt: skip
    a = ap.parse_args(argv)
    options = dict(o.split("=", 1) for o in a.handler_option)
    cores = sorted(os.sched_getaffinity(0))
    server_cores, load_cores = cores[: a.server_cores], cores[a.server_cores :]
    if not load_cores:
        raise SystemExit("--server-cores leaves no core for the load generator")
    a.load_workers = a.load_workers or len(load_cores)
    print(f"server pinned to cores {server_cores[0]}-{server_cores[-1]}, load generator to "
          f"{load_cores[0]}-{load_cores[-1]}", flush=True)  # fmt: skip
    shared = shared_cores(server_cores, load_cores)
    print(f"server and load cores sharing a physical core (SMT): {shared or 'none'}", flush=True)
    quiet = pre_ceiling(a.model, options, server_cores, a.pre_seconds)
    pre = quiet.items_s
    with pinned(set(server_cores)):
        fwd = forward_ceiling(a.model, options, a.device, a.dtype, a.batch)
    if a.device.startswith("cuda"):
        ceiling = min(pre, fwd["items_s"])
        limit = "pre-processing" if pre <= fwd["items_s"] else "forward"
    else:  # on the CPU both stages share the server's cores: each item costs both core times
        ceiling = 1.0 / (1.0 / pre + 1.0 / fwd["items_s"])
        limit = "pre-processing + forward on the same cores"
    fwd_s = fwd["items_s"]
    gpu_decode = ""
    if options.get("decode") == "gpu":
        gpu_decode = " (decode=gpu: pre-processing checks headers; the forward decodes and resizes)"
    print(f"ceilings: pre-processing {pre:,.0f}/s on {len(server_cores)} cores; forward {fwd_s:,.0f}/s "
          f"at batch {a.batch} (kernel alone {fwd['kernel_items_s']:,.0f}/s); "
          f"ceiling {ceiling:,.0f}/s ({limit}){gpu_decode}", flush=True)  # fmt: skip
    summary = [f"pre-processing ceiling's loop, load cores idle: {quiet.describe()}"]
    print(summary[-1], flush=True)
    if a.busy_neighbours:
        busy = pre_ceiling_beside(a.model, options, server_cores, load_cores, a.pre_seconds)
        summary.append(
            f"pre-processing ceiling with the load cores busy with the same loop: {busy.items_s:,.0f}/s "
            f"({100 * busy.items_s / pre:.0f} % of the quiet {pre:,.0f}/s); {busy.describe()}"
        )
        print(summary[-1], flush=True)
    variants = a.variant or [""]
    for k, variant in enumerate(variants):
        capacity, cut = sweep(a, variant, ceiling, server_cores, load_cores)
        ratio = capacity / ceiling if ceiling else 0.0
        verdict = "PASS" if ratio >= 0.6 else ("not reached before the cut" if cut else "MISS")
        summary.append(
            f"{a.model} on {a.device} ({a.dtype}, batch {a.batch}, {variant or 'defaults'}): capacity at "
            f"p99 <= {a.slo_ms:.0f} ms {'>= ' if cut else ''}{capacity:,.0f}/s = {100 * ratio:.0f} % of "
            f"the ceiling {ceiling:,.0f}/s ({limit}); target >= 60 %: {verdict}"
            + (" (interrupted: the sweep was cut short)" if cut else "")
        )
        if cut:
            skipped = variants[k + 1 :]
            summary += [f"{a.model} ({v or 'defaults'}): not measured (interrupted)" for v in skipped]
            break
        # The ceiling again once the sweep is over: how far the host's own speed moved meanwhile.
        again = pre_ceiling(a.model, options, server_cores, a.pre_seconds)
        summary.append(
            f"  pre-processing ceiling measured again after this sweep: {again.items_s:,.0f}/s "
            f"({100 * again.items_s / pre:.0f} % of the first, {again.cpu_ms:.2f} ms of CPU per item)"
        )
        print(summary[-1], flush=True)
    print("\n" + "\n".join(summary), flush=True)
    return 130 if cut else 0


def sweep(
    a: argparse.Namespace, variant: str, ceiling: float, server_cores: list[int], load_cores: list[int]
) -> tuple[float, bool]:
    """Rising rates against one server layout until p99 fails twice (halving first while nothing has
    held); the capacity found, and whether an interrupt (Ctrl-C, ``timeout -s INT``) cut it short:
    the step it stopped is dropped, the steps before it are kept and printed."""
    import shlex

    from netgain.experiments.orchestrate import ServerProcess

    serve = [
        "--model", a.model, "--device", a.device, "--dtype", a.dtype,
        "--max-batch-size", str(a.batch), "--max-queue-delay-ms", str(a.queue_delay_ms),
        "--pre-threads", str(a.pre_threads),
        *[x for o in a.handler_option for x in ("--handler-option", o)], *shlex.split(variant),
    ]  # fmt: skip
    print(f"\n== {variant or 'defaults'}", flush=True)
    rows: list[dict[str, Any]] = []
    capacity = 0.0
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        with pinned(set(server_cores)):
            server = stack.enter_context(ServerProcess(serve, log_path=os.path.join(tmp, "server.log")))
            server.wait_ready()
        tree = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
        top = "supervisor" if tree.children() else "server"  # --workers 0: one process does it all
        with open(os.path.join(tmp, "server.log")) as fh:
            print("".join(line for line in fh if "device process" in line).strip(), flush=True)
        rate = a.start * ceiling
        fails = 0
        profiled = not a.profile_at
        cut = False
        while rate <= 1.3 * ceiling and fails < 2:
            spies: list[tuple[str, str, subprocess.Popen[bytes]]] = []
            if not profiled and rate >= a.profile_at * ceiling:
                profiled = True
                secs = a.warmup_s + a.duration - 1
                for name, pid in server_processes(server.proc.pid).items():  # type: ignore[union-attr]
                    for gil in (False, True):
                        out = os.path.join(tmp, f"spy-{name}-{'gil' if gil else 'all'}.txt")
                        label = f"{name} {'holding the GIL' if gil else 'running'}"
                        spies.append((label, out, spy(pid, secs, out, gil)))
            before, t0 = tree_usage(tree, top), time.monotonic()
            try:
                with pinned(set(load_cores)):
                    r = run_rate(server.target, a, rate, os.path.join(tmp, f"r{len(rows)}"))
            except KeyboardInterrupt:
                print(f"  {rate:8,.0f}/s: interrupted; the sweep stops here", flush=True)
                cut = True
                break
            for label, out, proc in spies:
                proc.wait(60)
                found = spy_summary(out, a.warmup_s + a.duration - 1)
                print(f"py-spy at {rate:,.0f}/s offered, {label}:\n{found}")
            r["roles"] = per_request(tree_usage(tree, top), before, r["requests"], time.monotonic() - t0)
            rows.append(r)
            print(f"  {rate:8,.0f}/s: p99 {r['p99']:.1f} ms, {r['throughput']:,.0f}/s done, valid {r['valid']}, "  # noqa: E501
                  f"{r['bottleneck']}; phase p50 ms {json.dumps(r['phases'])}; tail (>= p99) phase means ms "
                  f"{json.dumps(r['tail'])}; cpu {json.dumps(r['cpu'])}; by role {json.dumps(r['roles'])}",
                  flush=True)  # fmt: skip
            if r["held"]:
                capacity = max(capacity, r["throughput"])
                fails = 0
            elif not capacity and rate > a.start * ceiling / 8:
                rate /= 2  # nothing has held yet: the start was above capacity, so go down, not up
                continue
            else:
                fails += 1
            rate += a.step * ceiling
    known = ("frontend", "pre-processing", "device", "supervisor", "server")
    roles = [k for k in known if any(k in r["roles"] for r in rows)]
    print(table(
        [[f"{r['rate']:,.0f}", f"{r['throughput']:,.0f}", f"{r['p50']:.1f}", f"{r['p99']:.1f}", r["errors"],
          "yes" if r["valid"] else "NO", r["bottleneck"], "yes" if r["held"] else "no", _steal(r),
          *[_role_cell(r["roles"].get(k)) for k in roles]] for r in rows],
        ["offered/s", "done/s", "p50 ms", "p99 ms", "errors", "valid", "bottleneck", f"p99<={a.slo_ms:.0f}",
         "steal cores", *[f"{k} CPU ms/req (inv. sw/s)" for k in roles]],
    ))  # fmt: skip
    held = [r for r in rows if r["held"]]
    if held:
        print(cpu_bound(held[-1], len(server_cores), ceiling), flush=True)
    return capacity, cut


def cpu_bound(row: dict[str, Any], cores: int, ceiling: float) -> str:
    """What the server's CPU per request at its last held step allows on its cores at most."""
    ms = sum(v["cpu_ms"] for v in row["roles"].values())
    if ms <= 0:
        return "server CPU per request at the last held step: not read"
    most = cores * 1e3 / ms
    share = f" = {100 * most / ceiling:.0f} % of the ceiling" if ceiling else ""
    return (
        f"server CPU per request at the last held step ({row['rate']:,.0f}/s offered): {ms:.2f} ms; "
        f"{cores} core{'s' if cores != 1 else ''} at that cost carry at most {most:,.0f}/s{share}"
    )


def per_request(
    after: dict[str, RoleUsage], before: dict[str, RoleUsage], requests: int, seconds: float
) -> dict[str, dict[str, float]]:
    """Each role's CPU ms per request answered in a rate's run (warm-up included) and involuntary
    switches per second per process over it."""
    out = {}
    for role, u in after.items():
        d = u - before.get(role, RoleUsage())
        out[role] = {
            "cpu_ms": round(1e3 * d.cpu_s / max(1, requests), 3),
            "switches_s": round(d.involuntary / max(1e-9, seconds) / max(1, u.processes)),
        }
    return out


def _steal(r: dict[str, Any]) -> str:
    """The host's CPU taken by its hypervisor during the rate's run, in cores ("" if not read)."""
    steal = (((r.get("cpu") or {}).get("host")) or {}).get("steal")
    return "" if steal is None else f"{steal:.2f}"


def _role_cell(v: dict[str, float] | None) -> str:
    return "" if v is None else f"{v['cpu_ms']:.2f} ({v['switches_s']:,.0f})"


if __name__ == "__main__":
    sys.exit(main())
