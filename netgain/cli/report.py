"""``netgain report RUN_DIR [--baseline RUN_DIR]``: the summary, report.json, report.md, report.html."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from netgain.cli.args import CliError, flag
from netgain.contract.report import Report

FORMATS = ("text", "json", "markdown", "html")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="analyse a run directory (and compare with a baseline): verdict first",
        description="Read RUN_DIR (from `netgain load`), write RUN_DIR/report.json, report.md "
        "and report.html, and print the summary with the verdict first.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `netgain load --out`")
    flag(p, "--baseline", metavar="RUN_DIR", help="baseline run (e.g. the CPU run) to compare against")
    flag(p, "--price-per-hour", type=float, help="hourly price of this run's instance (default: meta.json)")
    flag(p, "--baseline-price-per-hour", type=float, help="hourly price of the baseline's instance")
    flag(p, "--slo-p99-ms", type=float, help="p99 latency objective in ms (default: meta.json)")
    flag(
        p, "--warmup-s", type=float, help="override the warm-up: requests scheduled before this are excluded"
    )
    flag(p, "--force", action="store_true", help="compare even though the two runs' traffic differs")
    flag(p, "--span-log", metavar="FILE", help="server span log (JSON lines) to join by request id")
    flag(
        p,
        "--sweep",
        metavar="RUN_DIR",
        action="append",
        help="runs of this deployment at other rates: capacity at SLO, p99 vs rate (repeatable)",
    )
    flag(p, "--baseline-sweep", metavar="RUN_DIR", action="append", help="rate sweep runs of the baseline")
    flag(p, "--capacity-rps", type=float, help="per-replica capacity at SLO for the autoscaling model")
    flag(p, "--min-replicas", type=int, default=1, help="autoscaling model: replicas always running")
    flag(p, "--scale-down-after-s", type=float, default=60.0, help="autoscaling model: scale-down delay")
    flag(p, "--format", choices=FORMATS, default="text", help="what to print on stdout")
    flag(p, "--bootstrap", type=int, default=200, help="bootstrap draws for confidence intervals")
    flag(p, "--seed", type=int, default=0, help="seed of the bootstrap")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from netgain.analysis import build_report, to_json, write_outputs
    from netgain.analysis.render_html import render_html
    from netgain.analysis.render_text import render_markdown, terminal

    if args.min_replicas is not None and args.min_replicas < 0:
        raise CliError(f"--min-replicas must be >= 0, got {args.min_replicas}")
    try:
        report = build_report(
            args.run_dir,
            baseline_dir=args.baseline,
            price_per_hour=args.price_per_hour,
            baseline_price_per_hour=args.baseline_price_per_hour,
            slo_p99_ms=args.slo_p99_ms,
            span_log=args.span_log,
            bootstrap=args.bootstrap,
            seed=args.seed,
            force=args.force,
            warmup_s=args.warmup_s,
            sweep_dirs=args.sweep,
            baseline_sweep_dirs=args.baseline_sweep,
            capacity_rps=args.capacity_rps,
            min_replicas=args.min_replicas,
            scale_down_after_s=args.scale_down_after_s,
        )
    except (TypeError, AttributeError, KeyError) as exc:
        if args.debug:
            raise
        # A run directory whose meta.json holds a field of the wrong type (hand-edited, another
        # tool's): one line naming it, not a traceback.
        raise CliError(
            f"{args.run_dir}: meta.json (or --baseline's) has a field of an unexpected type or is "
            f"missing one ({type(exc).__name__}: {exc}); is it a run directory `netgain load` wrote?"
        ) from None
    paths = write_outputs(report, args.run_dir)
    renderers: dict[str, Callable[[Report], str]] = {
        "text": terminal,
        "json": to_json,
        "markdown": render_markdown,
        "html": render_html,
    }
    render = renderers[args.format]
    sys.stdout.write(render(report))
    if args.format == "text":
        sys.stdout.write("wrote " + ", ".join(str(p) for p in paths) + "\n")
    elif args.format == "json":
        sys.stdout.write("\n")
    sys.stdout.flush()  # a closed pipe (`| head -1`) fails here, inside dispatch, which keeps it silent
    return 0
