"""``netgain compare``, ``netgain drill`` and ``netgain profile``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from netgain.cli.args import CliError, flag
from netgain.contract.report import Report


def _ints(raw: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what} {raw!r}: expected comma-separated integers") from None
    if not out or min(out) < 1:
        raise CliError(f"{what} {raw!r}: values must be >= 1")
    return out


def _floats(raw: str, what: str) -> list[float]:
    try:
        out = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what} {raw!r}: expected comma-separated numbers") from None
    if min(out, default=1.0) <= 0:
        raise CliError(f"{what} {raw!r}: values must be > 0")
    return out


def _tuned(path: str | None) -> tuple[list[str], int]:
    """A tune result's best serve flags without its batch size (compare sweeps batch sizes), and that size."""
    if not path:
        return [], 0
    from netgain.experiments.tune import load_best

    flags = load_best(path)
    batch = 0
    if "--max-batch-size" in flags:
        i = flags.index("--max-batch-size")
        batch = int(flags[i + 1])
        flags = flags[:i] + flags[i + 2 :]
    return flags, batch


# Seconds a run costs beyond its warm-up and measured window: starting `netgain load`, its report
RUN_OVERHEAD_S = 4.0


def _trace_rate(path: str | None) -> float | None:
    """A replayed trace's mean rate: where the capacity search starts, not the unrelated --rate."""
    if not path:
        return None
    from netgain.loadgen.traces import read_trace

    try:
        return read_trace(path).mean_rate
    except (OSError, ValueError) as exc:
        raise CliError(f"--trace {path}: {exc}") from None


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def add_parser(sub: Any) -> None:
    c: argparse.ArgumentParser = sub.add_parser(
        "compare",
        help="CPU baseline vs GPU treatment on identical traffic: warm, cold, batch sizes, rates",
        description="Runs the same seeded traffic against a baseline and a treatment server (cpu and cuda by "
        "default): warm across --batch-sizes and --items, cold (right after start) at the batch size "
        "each side chooses, and each side's capacity at the SLO; then writes the comparison report "
        "with the verdict.",
    )
    flag(c, "--model", default="image", help="built-in model or module:Class")
    flag(c, "--handler-option", action="append", default=[], metavar="KEY=VALUE", help="handler option")
    flag(c, "--trace", default=None, help="recorded trace to replay (else --arrival/--rate)")
    flag(c, "--arrival", default="poisson", help="arrival model when no --trace")
    flag(c, "--rate", type=float, default=50.0, help="mean requests/s of the compared runs")
    flag(c, "--duration", type=float, default=30.0, help="measured seconds per run")
    flag(c, "--warmup-s", type=float, default=5.0, help="warm-up of the warm runs")
    flag(
        c, "--batch-sizes", default="1,4,16,64", help="server max batch sizes to sweep (1 is always included)"
    )
    flag(c, "--items", default="1", help="client items per request to sweep, e.g. 1,8")
    flag(
        c,
        "--rates",
        default=None,
        help="a fixed capacity sweep at these request rates instead of the capacity search",
    )
    flag(
        c,
        "--start-rps",
        type=float,
        default=None,
        help="the capacity search's first rate, as given (default: the --trace's mean rate; else --rate, "
        "or higher where the side's warm run held with room)",
    )
    flag(
        c,
        "--min-rps",
        type=float,
        default=1.0,
        help="the search's floor: a side missing here cannot meet the SLO",
    )
    flag(c, "--max-rps", type=float, default=100_000.0, help="the search's ceiling")
    flag(
        c,
        "--precision",
        type=float,
        default=0.1,
        help="bisect each capacity until (first missed - last held) / last held is at most this",
    )
    flag(
        c,
        "--sweep-duration",
        type=float,
        default=None,
        help="seconds per search (or sweep) run; a low rate's run is longer, up to twice this, to send "
        "enough requests to bound its p99 (default: half of --duration, at least 5)",
    )
    flag(c, "--cpu-price-per-hour", type=float, default=None, help="baseline host price (required)")
    flag(c, "--gpu-price-per-hour", type=float, default=None, help="treatment host price (required)")
    flag(c, "--slo-p99-ms", type=float, default=None, help="latency objective (required)")
    flag(c, "--baseline-device", default="cpu", help="device of the baseline")
    flag(
        c,
        "--treatment-device",
        default="cuda",
        help="device of the treatment (cpu to compare two CPU setups)",
    )
    flag(c, "--baseline-serve-args", default="", help="extra `netgain serve` flags for the baseline")
    flag(
        c,
        "--baseline-tuned",
        default=None,
        help="a `netgain tune` result (tune.json or its folder): the baseline serves with its best "
        "configuration, whose batch size joins --batch-sizes",
    )
    flag(c, "--treatment-tuned", default=None, help="the same for the treatment")
    flag(c, "--treatment-serve-args", default="", help="extra `netgain serve` flags for the treatment")
    flag(
        c,
        "--treatment-from",
        default=None,
        help="use treatment runs recorded elsewhere (an earlier OUT/treatment)",
    )
    flag(
        c,
        "--server-cpus",
        default="auto",
        help="cores the servers run on (0-11,14 or all); auto: with 8 usable cores or more all but the "
        "highest quarter, else every core, shared with the load generator (said in the output)",
    )
    flag(c, "--load-cpus", default="auto", help="cores the load generator runs on; auto: the cores left")
    flag(
        c,
        "--workers",
        type=int,
        default=0,
        help="load-generator workers per run; 0: one per load-generator core when those are the "
        "server's own (8 usable cores or more for auto), else 1",
    )
    flag(
        c,
        "--connections",
        type=int,
        default=16,
        help="connections per load worker: a server's frontend processes share its port, and the "
        "kernel spreads connections over them, not requests",
    )
    flag(c, "--seed", type=int, default=0, help="seed of traffic, payloads and weights")
    flag(c, "--out", default="runs/compare", help="output directory (re-run to resume)")
    c.set_defaults(func=run_compare)

    d: argparse.ArgumentParser = sub.add_parser(
        "drill", help="cold-start distribution from outside and inside; optional scale-up drill under load"
    )
    flag(d, "--model", default="image", help="built-in model or module:Class")
    flag(d, "--device", default="cpu", help="cpu, cuda or auto")
    flag(d, "--repeats", type=int, default=5, help="cold starts to measure")
    flag(d, "--serve-args", default="", help="extra `netgain serve` flags")
    flag(d, "--scale-up", action="store_true", default=False, help="also run the scale-up drill")
    flag(d, "--rate", type=float, default=20.0, help="scale-up drill: constant request rate")
    flag(d, "--duration", type=float, default=20.0, help="scale-up drill: seconds of load")
    flag(d, "--delay-s", type=float, default=3.0, help="scale-up drill: when replica 2 is spawned")
    flag(d, "--workers", type=int, default=1, help="scale-up drill: load workers")
    flag(d, "--out", default="runs/drill", help="output directory (drill.json)")
    d.set_defaults(func=run_drill)

    p: argparse.ArgumentParser = sub.add_parser(
        "profile", help="torch.profiler trace and py-spy CPU profile under steady load, beside the spans"
    )
    flag(p, "--model", default="image", help="built-in model or module:Class")
    flag(p, "--device", default="cpu", help="cpu, cuda or auto")
    flag(p, "--serve-args", default="", help="extra `netgain serve` flags")
    flag(p, "--rate", type=float, default=20.0, help="steady request rate")
    flag(p, "--duration", type=float, default=15.0, help="seconds of load")
    flag(p, "--batches", type=int, default=20, help="batches captured by torch.profiler")
    flag(
        p,
        "--ranges-only",
        action="store_true",
        help="record netgain's batch ranges and the device's kernels, not every operator (less overhead)",
    )
    flag(p, "--workers", type=int, default=1, help="load workers")
    flag(p, "--out", default="runs/profile", help="output directory")
    p.set_defaults(func=run_profile)


def run_compare(args: argparse.Namespace) -> int:
    from netgain.experiments.capacity import MAX_STEP_STRETCH, expected_runs, step_seconds
    from netgain.experiments.cpu_vs_gpu import CompareConfig, Side, run_side, summarize
    from netgain.experiments.orchestrate import choose_placement
    from netgain.experiments.progress import Progress

    missing = [
        f
        for f, v in (
            ("--cpu-price-per-hour", args.cpu_price_per_hour),
            ("--gpu-price-per-hour", args.gpu_price_per_hour),
            ("--slo-p99-ms", args.slo_p99_ms),
        )
        if v is None
    ]
    if missing:
        raise CliError(f"{', '.join(missing)} required: the verdict is about cost at a latency objective")
    if args.treatment_device.startswith("cuda") and not args.treatment_from and not _cuda_available():
        raise CliError(
            "no CUDA on this host: run compare on a GPU host, pass --treatment-from DIR with the "
            "treatment runs recorded there, or --treatment-device cpu to compare two CPU setups"
        )
    tuned = {side: _tuned(getattr(args, f"{side}_tuned")) for side in ("baseline", "treatment")}
    batch_sizes = sorted(
        set(_ints(args.batch_sizes, "--batch-sizes")) | {1} | {b for _, b in tuned.values() if b}
    )
    rates = _floats(args.rates, "--rates") if args.rates else []
    start = args.start_rps if args.start_rps is not None else _trace_rate(args.trace) or args.rate
    if not 0 < args.min_rps <= args.max_rps or not args.precision > 0 or not start > 0:
        raise CliError("--min-rps must be > 0 and at most --max-rps, --precision and --start-rps > 0")
    placement = choose_placement(args.server_cpus, args.load_cpus)
    traffic = (
        ["--trace", args.trace] if args.trace else ["--arrival", args.arrival, "--rate", f"{args.rate:g}"]
    )
    cfg = CompareConfig(
        model=args.model,
        traffic=traffic,
        duration_s=args.duration,
        warmup_s=args.warmup_s,
        batch_sizes=batch_sizes,
        items=_ints(args.items, "--items"),
        rates=rates,
        sweep_duration_s=args.sweep_duration or max(5.0, args.duration / 2),
        slo_p99_ms=args.slo_p99_ms,
        workers=placement.load_workers(args.workers),
        connections=args.connections,
        start_rps=start,
        start_from_warm=args.start_rps is None and not args.trace,  # a trace's mean hides its peaks
        min_rps=args.min_rps,
        max_rps=args.max_rps,
        precision=args.precision,
        out=args.out,
        handler_options=list(args.handler_option),
        seed=args.seed,
        placement=placement,
        baseline=Side(
            "baseline",
            args.baseline_device,
            args.cpu_price_per_hour,
            tuned["baseline"][0] + shlex.split(args.baseline_serve_args),
            tuned=args.baseline_tuned,
        ),
        treatment=Side(
            "treatment",
            args.treatment_device,
            args.gpu_price_per_hour,
            tuned["treatment"][0] + shlex.split(args.treatment_serve_args),
            from_dir=args.treatment_from,
            tuned=args.treatment_tuned,
        ),
    )
    os.makedirs(cfg.out, exist_ok=True)
    if args.workers < 0 or args.connections < 1:
        raise CliError("--workers must be >= 0 and --connections >= 1")
    print(
        f"netgain compare: {placement.describe_load(cfg.workers, cfg.connections)}",
        file=sys.stderr,
        flush=True,
    )
    runs = len(batch_sizes) * (1 + len([k for k in cfg.items if k != 1])) + 1  # + the chosen batch's cold run
    typical, most = expected_runs(start, cfg.min_rps, cfg.max_rps, cfg.precision)
    steps = len(rates) if rates else typical
    per_run = cfg.duration_s + cfg.warmup_s + RUN_OVERHEAD_S
    per_step = cfg.sweep_duration_s + min(cfg.warmup_s, 2.0) + RUN_OVERHEAD_S
    longest_step = per_step + (MAX_STEP_STRETCH - 1) * cfg.sweep_duration_s  # a low rate's longer step
    swept = sum(step_seconds(cfg.sweep_duration_s, r) - cfg.sweep_duration_s + per_step for r in rates)
    est = 2 * (runs * per_run + (swept if rates else steps * per_step))
    how = (
        f"a sweep of {len(rates)} rates"
        if rates
        else f"a capacity search of ~{typical} runs (at most {most}) to within {cfg.precision:.0%}"
    )
    print(
        f"netgain compare: per side {runs} runs of ~{per_run:.0f} s and {how} of ~{per_step:.0f} s: "
        f"expect ~{est / 60:.0f} min"
        + ("" if rates else f" (at most ~{2 * (runs * per_run + most * longest_step) / 60:.0f} min)"),
        file=sys.stderr,
        flush=True,
    )
    progress = Progress(2 * (runs + steps), estimate=not rates)
    baseline = run_side(cfg, cfg.baseline, progress)
    # Unless --start-rps says otherwise, the treatment's search starts where the baseline's ended:
    # the question is which side holds more, and doubling up from the default rate costs runs.
    held = baseline.get("capacity", {}).get("last_held") if args.start_rps is None else None
    sides = {"baseline": baseline, "treatment": run_side(cfg, cfg.treatment, progress, held)}
    reports, rows = summarize(cfg, sides)
    print_compare(reports, rows, cfg.out)
    print(placement.describe())
    return 0


def print_compare(reports: dict[str, Report], rows: list[list[Any]], out: str) -> None:
    for label in ("warm", "cold"):
        v = reports[label]["verdict"]  # netgain compare's reports are comparisons
        outcome = v["outcome"] or ("net_gain" if v["net_gain"] else "no_net_gain")
        answer = {"net_gain": "YES", "no_net_gain": "NO"}.get(outcome, "INCONCLUSIVE")
        print(f"{label.upper()}: net gain {answer}")
        for reason in v["reasons"]:
            print(f"  - {reason}")
    cross = reports["warm"].get("crossover")
    caps = reports["warm"].get("compare", {}).get("capacity") or {}
    for name, cap in caps.items():
        print(f"CAPACITY {name}: {_capacity_words(cap)}")
    if cross:
        from netgain.analysis.crossover import line

        print(line(cross))
    for name, f in (reports["warm"].get("trace_cost") or {}).items():
        if isinstance(f, dict):
            print(_trace_words(name, f))
    from netgain.experiments.compare_price import limit_lines

    for text in limit_lines(reports["warm"].get("compare", {}).get("limits", [])):
        print(text)
    print()
    head = [
        "side",
        "device",
        "batch",
        "run",
        "p50 ms",
        "p99 ms",
        "ok/s",
        "cost/1k",
        "bottleneck",
        "tail",
        "valid",
    ]
    cells = [head] + [[_fmt(x) for x in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for i, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\nreports: {out}/compare-warm/report.html, {out}/compare-cold/report.html")


def _capacity_words(cap: dict[str, Any]) -> str:
    from netgain.experiments.capacity import Capacity

    return Capacity.from_dict(cap).words()


def _trace_words(name: str, f: dict[str, Any]) -> str:
    """A side's TRACE line: the fleet sized for the trace's peak and the one following it, saying
    when following costs more (a short or spiky trace, where each scale-up's cold start is billed)."""
    peak, auto = f["peak"], f["autoscaled"]
    line = (
        f"TRACE {name}: peak-sized fleet {peak['replicas']} replicas, {_fmt(peak['cost_per_1k'])}/1k; "
        f"following the trace up to {auto['max_replicas']} replicas, {_fmt(auto['cost_per_1k'])}/1k "
        f"({auto['scale_ups']} scale-ups of {auto['cold_start_s']:.1f} s)"
    )
    if auto["instance_seconds"] > peak["instance_seconds"]:
        line += ": more than the peak-sized fleet, as each scale-up bills its cold start"
    return line


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "-" if x is None else str(x)


def run_drill(args: argparse.Namespace) -> int:
    from netgain.experiments.drill import run_drill as drill
    from netgain.experiments.drill import scale_up_lines

    if args.repeats < 1:
        raise CliError("--repeats must be >= 1")
    scale = (
        {"rate": args.rate, "duration_s": args.duration, "delay_s": args.delay_s, "workers": args.workers}
        if args.scale_up
        else None
    )
    summary = drill(args.model, args.device, args.repeats, shlex.split(args.serve_args), args.out, scale)
    for key in ("spawn_to_up_s", "spawn_to_serving_s", "spawn_to_first_ok_s"):
        d = summary[key]
        print(
            f"{key:22s} median {d['median']:.2f} s  p90 {d['p90']:.2f} s  max {d['max']:.2f} s  (n={d['n']})"
        )
    for phase, d in summary["inside"].items():
        print(f"  inside {phase:14s} median {d['median']:.3f} s  max {d['max']:.3f} s")
    if "scale_up" in summary:
        print("\n".join(scale_up_lines(summary["scale_up"])))
    print(f"wrote {args.out}/drill.json")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from netgain.experiments.profile import render
    from netgain.experiments.profile import run_profile as profile

    summary = profile(
        args.model,
        args.device,
        shlex.split(args.serve_args),
        args.out,
        args.rate,
        args.duration,
        args.batches,
        args.workers,
        args.ranges_only,
    )
    text = render(summary)
    with open(os.path.join(args.out, "profile-summary.md"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    print(f"\nwrote {args.out}/profile-summary.md", file=sys.stderr)
    return 0
