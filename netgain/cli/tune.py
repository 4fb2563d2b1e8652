"""``netgain tune``: search serve configurations for the most traffic within the SLO."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from netgain.cli.args import CliError, flag


def _list(raw: str, kind: Any, what: str) -> list[Any]:
    try:
        out = [kind(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what} {raw!r}: use a comma-separated list") from None
    if not out:
        raise CliError(f"{what} is empty")
    return out


def add_parser(sub: Any) -> None:
    t: argparse.ArgumentParser = sub.add_parser(
        "tune",
        help="search serve configurations for the highest throughput within the SLO",
        description="Start the server once per combination of the lists given and find, by a rate "
        "search with netgain load, the most traffic each holds within --slo-p99-ms; prints the table "
        "and writes OUT/tune.json, whose best configuration `netgain compare --baseline-tuned/"
        "--treatment-tuned` uses.",
    )
    flag(t, "--model", default="image", help="built-in model or module:Class")
    flag(t, "--handler-option", action="append", default=[], metavar="KEY=VALUE", help="handler option")
    flag(t, "--device", default="cpu", help="cpu, cuda or auto")
    flag(t, "--slo-p99-ms", type=float, default=100.0, help="latency objective")
    flag(t, "--workers-list", default="0,auto", help="`netgain serve --workers` values to try")
    flag(t, "--batch-sizes", default="8,32", help="--max-batch-size values to try")
    flag(t, "--queue-delays-ms", default="2", help="--max-queue-delay-ms values to try")
    flag(t, "--intra-op-threads-list", default="0", help="--intra-op-threads values to try (0: all)")
    flag(t, "--pre-threads-list", default="2", help="--pre-threads values to try")
    flag(t, "--pre-processes-list", default="auto", help="`netgain serve --pre-processes` values to try")
    flag(t, "--serve-args", default="", help="extra `netgain serve` flags for every configuration")
    flag(
        t,
        "--start-rps",
        type=float,
        default=50.0,
        help="first rate of each search (halves while it misses, doubles while it holds)",
    )
    flag(t, "--min-rps", type=float, default=1.0, help="lowest rate tried (the floor of the search)")
    flag(t, "--max-rps", type=float, default=100_000.0, help="highest rate tried")
    flag(
        t,
        "--precision",
        type=float,
        default=0.1,
        help="bisect until (first missed - last held) / last held is at most this",
    )
    flag(
        t,
        "--bisect-steps",
        type=int,
        default=None,
        help="at most this many runs between the last hold and the first miss (default: until --precision)",
    )
    flag(
        t,
        "--duration",
        type=float,
        default=10.0,
        help="measured seconds per run (a low rate's run is longer, up to twice this, to send enough "
        "requests to bound its p99)",
    )
    flag(t, "--warmup-s", type=float, default=2.0, help="warm-up seconds per run")
    flag(
        t,
        "--load-workers",
        type=int,
        default=0,
        help="load-generator workers per run; 0: one per load-generator core when those are the "
        "server's own (8 usable cores or more for auto), else 1",
    )
    flag(t, "--connections", type=int, default=16, help="connections per load worker")
    flag(
        t,
        "--server-cpus",
        default="auto",
        help="cores the servers run on (0-11,14 or all); auto: with 8 usable cores or more all but the "
        "highest quarter, else every core, shared with the load generator (said in the output)",
    )
    flag(t, "--load-cpus", default="auto", help="cores the load generator runs on; auto: the cores left")
    flag(t, "--seed", type=int, default=0, help="seed of traffic and payloads")
    flag(t, "--out", default="runs/tune", help="output directory (tune.json, tune.md, runs)")
    t.set_defaults(func=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    import shlex

    from netgain.experiments import tune

    if args.slo_p99_ms <= 0:
        raise CliError("--slo-p99-ms must be > 0")
    if args.start_rps <= 0 or args.max_rps < args.start_rps:
        raise CliError("--start-rps must be > 0 and at most --max-rps")
    if not 0 < args.min_rps <= args.start_rps or not args.precision > 0 or (args.bisect_steps or 0) < 0:
        raise CliError("--min-rps must be > 0 and at most --start-rps, --precision > 0, --bisect-steps >= 0")
    workers = _list(args.workers_list, str, "--workers-list")
    pre_processes = _list(args.pre_processes_list, str, "--pre-processes-list")
    for flag_name, values in (("--workers-list", workers), ("--pre-processes-list", pre_processes)):
        for w in values:
            if w != "auto" and not w.isdigit():
                raise CliError(f"{flag_name}: {w!r} is not a whole number or auto")
    from netgain.experiments.orchestrate import choose_placement

    placement = choose_placement(args.server_cpus, args.load_cpus)
    cfg = tune.TuneConfig(
        model=args.model,
        device=args.device,
        slo_p99_ms=args.slo_p99_ms,
        grid=tune.grid(
            workers,
            _list(args.batch_sizes, int, "--batch-sizes"),
            _list(args.queue_delays_ms, float, "--queue-delays-ms"),
            _list(args.intra_op_threads_list, int, "--intra-op-threads-list"),
            _list(args.pre_threads_list, int, "--pre-threads-list"),
            pre_processes,
        ),
        out=args.out,
        handler_options=list(args.handler_option),
        serve_args=shlex.split(args.serve_args),
        start_rps=args.start_rps,
        max_rps=args.max_rps,
        bisect_steps=args.bisect_steps,
        precision=args.precision,
        min_rps=args.min_rps,
        duration_s=args.duration,
        warmup_s=args.warmup_s,
        load_workers=placement.load_workers(args.load_workers),
        connections=args.connections,
        seed=args.seed,
        placement=placement,
    )

    def say(line: str) -> None:
        print(f"netgain tune: {line}", file=sys.stderr, flush=True)

    say(placement.describe_load(cfg.load_workers, cfg.connections))
    results = tune.tune(cfg, say)
    text = tune.table(results)
    with open(os.path.join(args.out, "tune.md"), "w") as fh:
        fh.write(f"# netgain tune: {args.model} on {args.device}, p99 <= {args.slo_p99_ms:g} ms\n\n{text}\n")
    print(text)
    top = tune.best(results)
    if top is None:
        print(f"no configuration held p99 <= {args.slo_p99_ms:g} ms at {args.min_rps:g}/s or more")
        return 4
    print(f"best: {' '.join(top.knobs.serve_args())} ({top.capacity:,.1f}/s); {args.out}/tune.json")
    return 0
