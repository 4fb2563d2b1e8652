"""``netgain compare``: the same traffic against a CPU baseline and a GPU treatment, warm across
server batch sizes and client items per request, cold (a fresh server) at the batch size each side
chooses, then each side's capacity at the SLO: by
the capacity search (``netgain.experiments.capacity``, the one tune runs) at the side's chosen batch
size, or, with ``--rates``, by a fixed rate sweep.

Every run is an ordinary run directory under ``OUT/<side>/...`` (a search step's is named by its
rate); a run whose ``meta.json`` exists is reused, so an interrupted compare resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from netgain.contract.report import Report, Sweep
from netgain.errors import NetgainError
from netgain.experiments import capacity
from netgain.experiments.compare_price import limits_of, price_trace, searched, step_trial
from netgain.experiments.orchestrate import Placement, ServerProcess, run_load
from netgain.experiments.progress import Progress
from netgain.experiments.steps import (
    LoadCrashed,
    once_more_if_crashed,
    run_step,
    search_start,
    set_aside,
    step_dir,
    warm_step,
)
from netgain.experiments.steps import done as _done


@dataclass
class Side:
    name: str  # "baseline" or "treatment"
    device: str
    price_per_hour: float
    serve_args: list[str] = field(default_factory=list)
    from_dir: str | None = None  # runs recorded elsewhere (e.g. on a GPU host)
    tuned: str | None = None  # the `netgain tune` result whose best flags are in serve_args


@dataclass
class CompareConfig:
    model: str
    traffic: list[str]  # netgain load flags that fix the traffic (--trace or --arrival/--rate ...)
    duration_s: float
    warmup_s: float
    batch_sizes: list[int]
    items: list[int]
    rates: list[float]  # a fixed sweep; empty: each side's capacity by the search
    sweep_duration_s: float
    slo_p99_ms: float
    workers: int
    out: str
    baseline: Side
    treatment: Side
    handler_options: list[str] = field(default_factory=list)
    seed: int = 0
    placement: Placement | None = None  # None: servers and load generator where compare runs
    connections: int = 1  # per load worker; several let the kernel spread them over frontends
    start_rps: float = 50.0  # the search's first rate
    start_from_warm: bool = True  # or higher, where the chosen batch's warm run held with room
    min_rps: float = 1.0  # its floor: below it a side that still misses cannot meet the SLO
    max_rps: float = 100_000.0  # its ceiling
    precision: float = 0.1  # bisect until (first missed - last held) / last held <= this
    max_error_ratio: float = 1e-3  # a search step holds only with errors at most this

    @property
    def server_cpus(self) -> list[int] | None:
        return self.placement.server if self.placement else None

    @property
    def load_cpus(self) -> list[int] | None:
        return self.placement.load if self.placement else None


def _serve_args(cfg: CompareConfig, side: Side, batch: int, span_log: str) -> list[str]:
    args = [
        "--model",
        cfg.model,
        "--device",
        side.device,
        "--max-batch-size",
        str(batch),
        "--seed",
        str(cfg.seed),
        "--span-log",
        span_log,
    ]
    for opt in cfg.handler_options:
        args += ["--handler-option", opt]
    return args + side.serve_args


def _load(
    cfg: CompareConfig,
    side: Side,
    target: str,
    out: str,
    *,
    warmup_s: float,
    extra: list[str],
    traffic: list[str] | None = None,
    duration_s: float | None = None,
) -> int:
    """One ``netgain load`` run of this compare (``traffic``/``duration_s``: a sweep's own)."""
    args = [
        "--target",
        target,
        *(cfg.traffic if traffic is None else traffic),
        "--duration",
        str(cfg.duration_s if duration_s is None else duration_s),
        "--warmup-s",
        str(warmup_s),
        "--workers",
        str(cfg.workers),
        "--connections",
        str(cfg.connections),
        "--seed",
        str(cfg.seed),
        "--out",
        out,
        "--price-per-hour",
        str(side.price_per_hour),
        "--slo-p99-ms",
        str(cfg.slo_p99_ms),
        *extra,
    ]
    rc = run_load(args, quiet=True, cpus=cfg.load_cpus)
    if rc < 0:
        raise LoadCrashed(f"netgain load crashed (signal {-rc}) for {out}")
    if rc not in (0, 3, 4, 5):
        raise NetgainError(f"netgain load failed (exit {rc}) for {out}")
    return rc


def _p99(run_dir: str) -> float:
    return _summary(run_dir)[0]


@functools.cache
def _summary(run_dir: str) -> tuple[float, bool]:
    """(p99 ms, valid) of a finished run; cached, since progress lines and the batch choice both ask."""
    from netgain.analysis import build_report

    rep = build_report(run_dir, bootstrap=0)
    return float(rep["latency_ms"]["p99"] or float("inf")), bool(rep["valid"])


def _recorded_device(run_dir: str) -> str | None:
    """The device the server of a finished run said it ran on (meta.json), or None."""
    from netgain.analysis.rundir import AnalysisError, load_meta

    try:
        device = load_meta(run_dir).get("server", {}).get("device")
    except AnalysisError:
        return None
    return str(device) if device else None


def run_side(
    cfg: CompareConfig, side: Side, progress: Progress, start: float | None = None
) -> dict[str, Any]:
    """All runs of one side; returns {"batches": {b: {...paths}}, "best_batch": b, "sweep": [dirs]}.
    ``start``: the capacity search's first rate, when not ``cfg.start_rps``."""
    root = side.from_dir or os.path.join(cfg.out, side.name)
    if side.from_dir:
        # Imported runs say where they ran: label them with that, not with --treatment-device.
        first = os.path.join(root, f"b{cfg.batch_sizes[0]}", "warm")
        side.device = _recorded_device(first) or side.device
    os.makedirs(root, exist_ok=True)
    result: dict[str, Any] = {"root": root, "batches": {}, "sweep": []}
    for b in cfg.batch_sizes:
        cold = os.path.join(root, f"b{b}", "cold")
        runs = {"cold": cold} if _done(cold) else {}  # one recorded by an earlier compare stays in the table
        runs["warm"] = os.path.join(root, f"b{b}", "warm")
        runs.update({f"items{k}": os.path.join(root, f"b{b}", f"items{k}") for k in cfg.items if k != 1})
        result["batches"][b] = runs
        _runs_or_reused(cfg, side, b, runs, progress)
    b = result["best_batch"] = best_batch(cfg, {k: r["warm"] for k, r in result["batches"].items()})
    if "cold" not in result["batches"][b]:  # only the chosen batch's is priced: a fresh server of its own
        cold = os.path.join(root, f"b{b}", "cold")
        result["batches"][b] = {"cold": cold, **result["batches"][b]}
        _runs_or_reused(cfg, side, b, {"cold": cold}, progress)
    if not cfg.rates:
        return search_side(cfg, side, result, progress, start)
    sweep = [os.path.join(root, "sweep", f"b{b}-r{r:g}") for r in cfg.rates]
    result["sweep"] = sweep
    result["sweep_rates"] = list(cfg.rates)
    if side.from_dir or all(_done(d) for d in sweep):
        for _ in sweep:
            progress.step(f"{side.name} sweep: reused")
        return result
    span_log = os.path.join(root, "sweep", "spans.jsonl")
    os.makedirs(os.path.dirname(span_log), exist_ok=True)
    with ServerProcess(
        _serve_args(cfg, side, b, span_log),
        log_path=os.path.join(root, "sweep", "server.log"),
        cpus=cfg.server_cpus,
    ) as sp:
        sp.wait_ready()
        for rate, run_dir in zip(cfg.rates, sweep, strict=True):
            if not _done(run_dir):
                measure = functools.partial(_sweep_load, cfg, side, sp.target, run_dir, rate)
                once_more_if_crashed(run_dir, measure, progress.note)
            progress.step(
                f"{side.name} {side.device} sweep batch {b} at {rate:g} req/s: p99 {_p99(run_dir):.2f} ms"
            )
    return result


def _runs_or_reused(cfg: CompareConfig, side: Side, b: int, runs: dict[str, str], progress: Progress) -> None:
    """``runs`` measured (``_batch_runs``), or reused when all are finished or recorded elsewhere."""
    if all(_done(d) for d in runs.values()) or side.from_dir:
        for label in runs:
            progress.step(f"{side.name} {side.device} batch {b} {label}: reused")
        return
    _batch_runs(cfg, side, b, runs, progress)


def _batch_runs(cfg: CompareConfig, side: Side, b: int, runs: dict[str, str], progress: Progress) -> None:
    """One batch size's compared runs on one server, in order (a cold run first, right after start).
    A run the load generator made invalid is measured once more, on a fresh server (a cold run needs
    one): an invalid run is no evidence, and the verdict would be INCONCLUSIVE for a reason another
    run removes."""
    head = f"{side.name} {side.device} batch {b}"
    todo = [label for label, d in runs.items() if not _done(d)]
    for attempt in range(2):
        redo: dict[str, str] = {}  # label -> why it is measured again
        span_log = os.path.join(os.path.dirname(next(iter(runs.values()))), "spans.jsonl")
        os.makedirs(os.path.dirname(span_log), exist_ok=True)
        with ServerProcess(
            _serve_args(cfg, side, b, span_log),
            log_path=os.path.join(os.path.dirname(span_log), "server.log"),
            cpus=cfg.server_cpus,
        ) as sp:
            ready_s = sp.wait_ready()
            for label, run_dir in runs.items():
                if label not in todo:
                    if not attempt:
                        progress.step(f"{head} {label}: reused")
                    continue
                try:
                    _compared_load(cfg, side, sp.target, label, run_dir, ready_s)
                except LoadCrashed as exc:  # a cold run needs a fresh server: all go the invalid runs' way
                    if attempt:
                        raise
                    redo[label] = str(exc)
                    continue
                if not attempt and not _summary(run_dir)[1]:
                    redo[label] = "invalid run (the load generator fell behind)"
                    continue
                progress.step(f"{head} {label}: p99 {_p99(run_dir):.2f} ms")
        if not redo:
            return
        for label, why in redo.items():
            set_aside(runs[label])
            progress.note(f"{head} {label}: {why}, repeated once")
        _summary.cache_clear()
        todo = list(redo)


def _compared_load(
    cfg: CompareConfig, side: Side, target: str, label: str, run_dir: str, ready_s: float
) -> None:
    if label == "cold":  # right after start: no warm-up excluded, the first requests count
        _load(cfg, side, target, run_dir, warmup_s=0.0, extra=[])
        with open(os.path.join(run_dir, "drill.json"), "w") as fh:
            json.dump({"spawn_to_serving_s": ready_s}, fh)
    elif label == "warm":
        _load(cfg, side, target, run_dir, warmup_s=cfg.warmup_s, extra=[])
    else:
        _load(cfg, side, target, run_dir, warmup_s=cfg.warmup_s, extra=["--items", label[5:]])


def _sweep_load(cfg: CompareConfig, side: Side, target: str, run_dir: str, rate: float) -> None:
    _load(
        cfg,
        side,
        target,
        run_dir,
        warmup_s=min(cfg.warmup_s, 2.0),
        extra=[],
        traffic=_with_rate(cfg.traffic, rate),
        duration_s=capacity.step_seconds(cfg.sweep_duration_s, rate),
    )


def search_side(
    cfg: CompareConfig, side: Side, result: dict[str, Any], progress: Progress, start: float | None = None
) -> dict[str, Any]:
    """The capacity search at the side's chosen batch size; each step a sweep run (reused when present;
    at the warm run's rate, the warm run when valid). With runs recorded elsewhere (``from_dir``) the
    bracket is read from the steps found there."""
    root, b = result["root"], result["best_batch"]
    dirs: list[tuple[float, str]] = []
    head = f"{side.name} {side.device} search batch {b}"
    warm = warm_step(cfg.traffic, result["batches"][b]["warm"])
    if side.from_dir:
        base = os.path.join(root, "search", f"b{b}")
        names = sorted(os.listdir(base)) if os.path.isdir(base) else []
        found = [
            (float(n[1:]), os.path.join(base, n))
            for n in names
            if n.startswith("r") and _done(os.path.join(base, n))
        ]
        if warm is not None and all(r != warm[0] for r, _ in found):
            found.append(warm)
        trials = [step_trial(cfg, d, r) for r, d in found]
        cap = capacity.from_trials(trials, floor=cfg.min_rps, ceiling=cfg.max_rps, precision=cfg.precision)
        dirs = found
        progress.step(f"{head}: {len(found)} runs reused")
    else:
        stack = contextlib.ExitStack()
        server: list[ServerProcess] = []

        def target() -> str:  # the server starts at the first step that has to run
            if not server:
                span_log = os.path.join(root, "search", f"b{b}", "spans.jsonl")
                os.makedirs(os.path.dirname(span_log), exist_ok=True)
                sp = stack.enter_context(
                    ServerProcess(
                        _serve_args(cfg, side, b, span_log),
                        log_path=os.path.join(root, "search", f"b{b}", "server.log"),
                        cpus=cfg.server_cpus,
                    )
                )
                sp.wait_ready()
                server.append(sp)
            return server[0].target

        def run(rate: float) -> capacity.Trial:
            run_dir, note = step_dir(root, b, rate), ""
            t = step_trial(cfg, warm[1], rate) if warm and rate == warm[0] and not _done(run_dir) else None
            if warm and t is not None and t.valid:
                run_dir, note = warm[1], "the compared warm run"
            else:
                t, reused = run_step(
                    run_dir,
                    rate,
                    cfg.slo_p99_ms,
                    cfg.max_error_ratio,
                    lambda: _sweep_load(cfg, side, target(), run_dir, rate),
                    lambda msg: progress.note(f"{head} {msg}"),
                )
                note = "reused" if reused else ""
            dirs.append((rate, run_dir))
            word = "held" if t.held else "missed"
            if capacity.thin(t.samples):
                word += f" on {t.samples} successful requests (a p99 needs {capacity.P99_SAMPLES})"
            progress.step(
                f"{head} at {rate:.4g} req/s: {t.throughput:.4g} done/s, p99 {t.p99:.2f} ms, {word}"
                + (f" ({note})" if note else "")
            )
            return t

        first = search_start(
            os.path.join(root, "search", f"b{b}"),
            start or cfg.start_rps,
            result["batches"][b]["warm"] if cfg.start_from_warm else None,
            cfg.slo_p99_ms,
            cfg.max_error_ratio,
            cfg.max_rps,
            lambda msg: progress.note(f"{head} {msg}"),
        )
        with stack:
            cap = capacity.search(
                run, first, floor=cfg.min_rps, ceiling=cfg.max_rps, precision=cfg.precision
            ).capacity
    result["sweep"] = [d for _, d in dirs]
    result["sweep_rates"] = [r for r, _ in dirs]
    result["capacity"] = cap.to_dict()
    print(f"{head} capacity: {cap.words()}", file=sys.stderr, flush=True)
    return result


def _with_rate(traffic: list[str], rate: float) -> list[str]:
    out = list(traffic)
    if "--rate" in out:
        out[out.index("--rate") + 1] = f"{rate:g}"
    else:
        out += ["--rate", f"{rate:g}"]
    return out


def best_batch(cfg: CompareConfig, warm_runs: dict[int, str]) -> int:
    """The largest batch size whose valid warm run meets the SLO (more capacity under load); if
    none does, the valid one with the lowest p99; invalid runs only when nothing else exists."""
    stats = {b: _summary(d) for b, d in warm_runs.items() if _done(d)}
    if not stats:
        raise NetgainError("no warm run finished: nothing to compare")
    valid = {b: p99 for b, (p99, ok) in stats.items() if ok} or {b: p99 for b, (p99, _) in stats.items()}
    meeting = [b for b, p99 in valid.items() if p99 <= cfg.slo_p99_ms]
    return max(meeting) if meeting else min(valid, key=lambda b: valid[b])


def summarize(
    cfg: CompareConfig, sides: dict[str, dict[str, Any]]
) -> tuple[dict[str, Report], list[list[Any]]]:
    from netgain.analysis import build_report, write_outputs

    rows: list[list[Any]] = []
    for name, res in sides.items():
        side = cfg.baseline if name == "baseline" else cfg.treatment
        for b, runs in res["batches"].items():
            for label, run_dir in runs.items():
                if not _done(run_dir):
                    continue
                rep = build_report(
                    run_dir, price_per_hour=side.price_per_hour, slo_p99_ms=cfg.slo_p99_ms, bootstrap=0
                )
                cost = rep["cost_per_1k"]
                rows.append(
                    [
                        name,
                        side.device,
                        b,
                        label,
                        rep["latency_ms"]["p50"],
                        rep["latency_ms"]["p99"],
                        rep["throughput_rps"],
                        cost,
                        rep["bottleneck"]["kind"],
                        rep["tail"].get("dominant"),
                        "valid" if rep["valid"] else "INVALID",
                    ]
                )
    base, treat = sides["baseline"], sides["treatment"]
    out: dict[str, Report] = {}
    cross: dict[str, Any] | None = None
    trace_cost: dict[str, Any] | None = None
    limits = limits_of(cfg, sides)  # from the rate sweeps: the same for both reports
    caps = searched(sides)
    for label in ("warm", "cold"):
        rep = build_report(
            treat["batches"][treat["best_batch"]][label],
            baseline_dir=base["batches"][base["best_batch"]][label],
            price_per_hour=cfg.treatment.price_per_hour,
            baseline_price_per_hour=cfg.baseline.price_per_hour,
            slo_p99_ms=cfg.slo_p99_ms,
            sweep_dirs=[d for d in treat["sweep"] if _done(d)],
            baseline_sweep_dirs=[d for d in base["sweep"] if _done(d)],
            capacity_rps=caps["treatment"]["capacity_rps"] if caps else None,
            baseline_capacity_rps=caps["baseline"]["capacity_rps"] if caps else None,
            capacities=caps,
        )
        rep["compare"] = {
            "best_batch": {"baseline": base["best_batch"], "treatment": treat["best_batch"]},
            "runs": rows,
            "mode": label,
        }
        if cross is None:  # from the rate sweeps (warm runs): the same for both reports
            cross = crossover_of(cfg, sides, rep)
        rep["crossover"] = cross
        rep["compare"]["limits"] = limits
        if caps is not None:
            rep["compare"]["capacity"] = caps
            if "--trace" in cfg.traffic:
                trace_cost = trace_cost or price_trace(cfg, sides, rep)
                rep["trace_cost"] = trace_cost
        dest = os.path.join(cfg.out, f"compare-{label}")
        os.makedirs(dest, exist_ok=True)
        write_outputs(rep, dest)
        out[label] = rep
    return out, rows


def crossover_of(cfg: CompareConfig, sides: dict[str, dict[str, Any]], rep: Report) -> dict[str, Any]:
    """Cost per 1k at the SLO against the rate, each side at the capacity its search (or sweep)
    measured (with its tuned configuration when given), and the rate where the treatment starts to win."""
    from netgain.analysis.crossover import crossover, from_capacities

    per_side: dict[str, dict[str, Any]] = {}
    for name, side in (("baseline", cfg.baseline), ("treatment", cfg.treatment)):
        sweep: Sweep | dict[str, Any] = (rep["baseline"] if name == "baseline" else rep).get("sweep") or {}
        per_side[name] = {
            "device": side.device,
            "price_per_hour": side.price_per_hour,
            "batch_size": sides[name]["best_batch"],
            "serve_args": list(side.serve_args),
            "tuned": side.tuned,
            "capacity_rps": sweep.get("capacity_rps"),
            "capacity_from_run": sweep.get("from_run"),
            "runs": sweep.get("runs", 0),
            "runs_meeting_slo": sweep.get("runs_meeting_slo", 0),
        }
        if "capacity" in sides[name]:
            per_side[name]["capacity"] = dict(sides[name]["capacity"])
    if searched(sides):
        return from_capacities(per_side, slo_p99_ms=cfg.slo_p99_ms)
    return crossover(cfg.rates, per_side, slo_p99_ms=cfg.slo_p99_ms)
