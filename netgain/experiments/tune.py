"""``netgain tune``: the server configuration that carries the most traffic within the SLO.

For every combination of the lists given (frontend processes, pre-processing processes, max batch
size, max queue delay, intra-op threads, pre-processing threads) a server is started and driven by
``netgain load`` with Poisson arrivals at the rates the capacity search of
``netgain.experiments.capacity`` picks (the one compare runs): from ``start_rps`` down by halves
while a run misses (p99 over the SLO, the run INVALID, or errors over 0.1 %), up by doubling while
it holds, then bisecting between the last rate that held and the first that did not until they are
within ``precision``. A configuration's capacity is the completed rate of
its best run that held. The search is the one Triton's Model Analyzer does, per device, on the
user's own host.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from netgain.contract.report import TUNE_SCHEMA, BestConfig, Report, TunedConfig, TuneResult, read_report
from netgain.errors import NetgainError
from netgain.experiments.capacity import Capacity, Trial, step_seconds
from netgain.experiments.capacity import search as capacity_search
from netgain.experiments.orchestrate import Placement, pinned, run_child


@dataclass
class Knobs:
    workers: str = "auto"
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    intra_op_threads: int = 0
    pre_threads: int = 2
    pre_processes: str = "auto"

    def serve_args(self) -> list[str]:
        return [
            "--workers", self.workers, "--max-batch-size", str(self.max_batch_size),
            "--max-queue-delay-ms", f"{self.max_queue_delay_ms:g}",
            "--intra-op-threads", str(self.intra_op_threads), "--pre-threads", str(self.pre_threads),
            "--pre-processes", self.pre_processes,
        ]  # fmt: skip


@dataclass
class Result:
    knobs: Knobs
    trials: list[Trial] = field(default_factory=list)
    error: str = ""
    bracket: Capacity | None = None

    @property
    def capacity(self) -> float | None:
        held = [t.throughput for t in self.trials if t.held]
        return max(held) if held else None


@dataclass
class TuneConfig:
    model: str
    device: str
    slo_p99_ms: float
    grid: list[Knobs]
    out: str
    handler_options: list[str] = field(default_factory=list)
    serve_args: list[str] = field(default_factory=list)
    start_rps: float = 50.0
    max_rps: float = 100_000.0
    bisect_steps: int | None = None  # at most this many bisection runs; None: until the precision
    precision: float = 0.1
    min_rps: float = 1.0  # the floor of the downward search
    duration_s: float = 10.0
    warmup_s: float = 2.0
    load_workers: int = 1
    connections: int = 16
    seed: int = 0
    max_error_ratio: float = 1e-3
    placement: Placement | None = None  # None: server and load generator where tune runs


def grid(
    workers: Sequence[str],
    batch_sizes: Sequence[int],
    delays_ms: Sequence[float],
    intra_op: Sequence[int],
    pre_threads: Sequence[int],
    pre_processes: Sequence[str] = ("auto",),
) -> list[Knobs]:
    combos = itertools.product(workers, batch_sizes, delays_ms, intra_op, pre_threads, pre_processes)
    # --pre-processes N needs frontend processes: a one-process server takes only auto (none).
    return [Knobs(*c) for c in combos if c[0] != "0" or c[5] in ("auto", "0")]


def _netgain(*args: str) -> list[str]:
    return [sys.executable, "-m", "netgain.cli", *args]


def load_and_report(
    target: str,
    out: str,
    *,
    model: str,
    rate: float,
    duration_s: float,
    warmup_s: float,
    load_workers: int,
    connections: int,
    seed: int,
    cpus: Sequence[int] | None = None,
) -> Report | None:
    """One open-loop Poisson ``netgain load`` run into ``out`` and its ``netgain report``; the report
    (read with its schema and keys checked), or None when no report came out."""
    load = [
        "load", "--target", target, "--arrival", "poisson", "--rate", f"{rate:.3f}",
        "--duration", f"{duration_s:g}", "--warmup-s", f"{warmup_s:g}",
        "--workers", str(load_workers), "--connections", str(connections), "--model", model,
        "--out", out, "--force", "--quiet", "--seed", str(seed), "--timeout-s", "5",
    ]  # fmt: skip
    with pinned(cpus):
        run_child(_netgain(*load), stdout=subprocess.DEVNULL)
    run_child(_netgain("report", out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not os.path.exists(os.path.join(out, "report.json")):
        return None
    return read_report(out)


def trial(rep: Report | None, rate: float, slo_p99_ms: float, max_error_ratio: float) -> Trial:
    """A run's figures and whether it held: valid, p99 within the SLO, errors at most the ratio."""
    if rep is None:
        return Trial(rate, 0.0, float("nan"), float("nan"), 0, 1.0, False, "no report", False)
    lat = rep["latency_ms"]
    n_err = int(sum(rep["errors"].values()))
    ratio = float(rep["error_rate"] or 0.0)
    # no successful request: no quantile (null in report.json), a trial that does not hold
    p99 = float("nan") if lat["p99"] is None else float(lat["p99"])
    valid = bool(rep["valid"])
    held = valid and p99 <= slo_p99_ms and ratio <= max_error_ratio
    bn = rep["bottleneck"]
    levers = [(str(k["kind"]), str(k["action"])) for k in bn.get("kinds", [])]
    return Trial(
        rate,
        float(rep["throughput_rps"]),
        float("nan") if lat["p50"] is None else float(lat["p50"]),
        p99,
        n_err,
        ratio,
        valid,
        str(bn["kind"]),
        held,
        tuple(levers) or ((str(bn["kind"]), str(bn["action"])),),
        int((rep.get("enough_samples") or {}).get("p99", {}).get("n", 0)),
    )


def measure(target: str, cfg: TuneConfig, rate: float, out: str) -> Trial:
    """One ``netgain load`` run at ``rate`` and its report's figures."""
    rep = load_and_report(
        target,
        out,
        model=cfg.model,
        rate=rate,
        duration_s=step_seconds(cfg.duration_s, rate),
        warmup_s=cfg.warmup_s,
        load_workers=cfg.load_workers,
        connections=cfg.connections,
        seed=cfg.seed,
        cpus=cfg.placement.load if cfg.placement else None,
    )
    return trial(rep, rate, cfg.slo_p99_ms, cfg.max_error_ratio)


def search(
    run: Callable[[float], Trial], start: float, limit: float, bisect_steps: int | None = None
) -> list[Trial]:
    """The shared capacity search (``netgain.experiments.capacity``) from ``start`` up to ``limit``,
    at most ``bisect_steps`` bisections (None: until within 10 %): the trials, in order."""
    res = capacity_search(
        run, start, floor=min(1.0, start), ceiling=limit, precision=0.1, max_bisect=bisect_steps
    )
    return res.trials


@contextlib.contextmanager
def _server(cfg: TuneConfig, knobs: Knobs, log_path: str) -> Iterator[Any]:
    from netgain.experiments.orchestrate import ServerProcess

    args = ["--model", cfg.model, "--device", cfg.device, *knobs.serve_args()]
    for opt in cfg.handler_options:
        args += ["--handler-option", opt]
    cpus = cfg.placement.server if cfg.placement else None
    with ServerProcess([*args, *cfg.serve_args], log_path=log_path, cpus=cpus) as sp:
        sp.wait_ready()
        yield sp


def tune(cfg: TuneConfig, say: Callable[[str], None] = print) -> list[Result]:
    os.makedirs(cfg.out, exist_ok=True)
    results: list[Result] = []
    for i, knobs in enumerate(cfg.grid):
        res = Result(knobs)
        results.append(res)
        say(f"config {i + 1}/{len(cfg.grid)}: {' '.join(knobs.serve_args())}")
        root = os.path.join(cfg.out, f"c{i}")
        os.makedirs(root, exist_ok=True)
        try:
            with _server(cfg, knobs, os.path.join(root, "server.log")) as sp:
                counter = itertools.count()

                def one(rate: float, sp: Any = sp, root: str = root, counter: Any = counter) -> Trial:
                    t = measure(sp.target, cfg, rate, os.path.join(root, f"r{next(counter)}"))
                    mark = "held" if t.held else "missed"
                    say(f"  {rate:10,.1f}/s: {t.throughput:10,.1f}/s done, p99 {t.p99:8.1f} ms, {mark}")
                    return t

                found = capacity_search(
                    one,
                    cfg.start_rps,
                    floor=min(cfg.min_rps, cfg.start_rps),
                    ceiling=cfg.max_rps,
                    precision=cfg.precision,
                    max_bisect=cfg.bisect_steps,
                )
                res.trials, res.bracket = found.trials, found.capacity
        except (NetgainError, OSError, RuntimeError, TimeoutError) as exc:
            res.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            say(f"  failed: {res.error}")
        write(cfg, results)
    return results


def best(results: Sequence[Result]) -> Result | None:
    ok = [r for r in results if r.capacity is not None]
    return max(ok, key=lambda r: r.capacity or 0.0) if ok else None


def write(cfg: TuneConfig, results: Sequence[Result]) -> str:
    top = best(results)
    doc: TuneResult = {
        "schema": TUNE_SCHEMA,
        "model": cfg.model,
        "device": cfg.device,
        "slo_p99_ms": cfg.slo_p99_ms,
        "configs": [
            cast(
                TunedConfig,
                {
                    **asdict(r.knobs),
                    "serve_args": r.knobs.serve_args(),
                    "capacity_rps": r.capacity,
                    "bracket": r.bracket.to_dict() if r.bracket else None,
                    "error": r.error,
                    "trials": [asdict(t) for t in r.trials],
                },
            )
            for r in results
        ],
        "best": None
        if top is None
        else cast(
            BestConfig,
            {**asdict(top.knobs), "serve_args": top.knobs.serve_args(), "capacity_rps": top.capacity},
        ),
    }
    path = os.path.join(cfg.out, "tune.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=float)
    os.replace(tmp, path)
    return path


def table(results: Sequence[Result]) -> str:
    head = [
        "workers",
        "pre procs",
        "batch",
        "delay ms",
        "intra-op",
        "pre threads",
        "capacity/s",
        "runs",
        "limit",
    ]
    rows = []
    top = best(results)
    for r in sorted(results, key=lambda r: -(r.capacity or -1.0)):
        last_miss = next((t for t in reversed(r.trials) if not t.held), None)
        limit = r.error or (last_miss.bottleneck if last_miss else "not reached")
        cap = "-" if r.capacity is None else f"{r.capacity:,.1f}"
        k = r.knobs
        rows.append([k.workers, k.pre_processes, k.max_batch_size, f"{k.max_queue_delay_ms:g}",
                     k.intra_op_threads or "all", k.pre_threads, cap + (" *" if r is top else ""),
                     len(r.trials), limit])  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    lines = [" | ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    if top is not None:  # the mark is said, not guessed
        lines.append('* the best configuration: the most traffic within the SLO (tune.json\'s "best")')
    return "\n".join(lines)


def load_best(path: str) -> list[str]:
    """The best configuration's serve flags from a tune.json (or a folder holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, "tune.json")
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise NetgainError(f"cannot read tune result {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != TUNE_SCHEMA:
        raise NetgainError(f"{path} is not a netgain tune result of schema {TUNE_SCHEMA}")
    top = doc.get("best")
    if not top:
        raise NetgainError(f"{path}: no configuration held the SLO; nothing to use")
    return [str(x) for x in top["serve_args"]]
