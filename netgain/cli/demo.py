"""``netgain demo``: the whole chain on this machine — serve, load, report — with built-in defaults."""

from __future__ import annotations

import argparse
import os
from typing import Any

from netgain.cli.args import CliError, flag


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="serve a built-in model, load it open-loop, and report (no setup, no downloads)",
        description="Start `netgain serve` here, run `netgain load` against it, then `netgain report`.",
    )
    flag(p, "--model", default="image", help="built-in model: image, text, tabular or null")
    flag(p, "--device", default="cpu", help="cpu, cuda or auto")
    flag(p, "--rate", type=float, default=20.0, help="requests/s (Poisson arrivals)")
    flag(p, "--duration", type=float, default=20.0, help="measured seconds")
    flag(p, "--warmup-s", type=float, default=3.0, help="warm-up seconds before measuring")
    flag(p, "--workers", type=int, default=1, help="load-generator worker processes")
    flag(p, "--max-batch-size", type=int, default=8, help="server batch size")
    flag(
        p,
        "--handler-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="handler option (default for image: size=96, to suit small CPUs)",
    )
    flag(p, "--price-per-hour", type=float, default=0.40, help="server price for cost per 1k")
    flag(p, "--slo-p99-ms", type=float, default=500.0, help="latency objective for the report")
    flag(p, "--out", default="runs/demo", help="run directory (the demo's own: replaced by each demo)")
    p.set_defaults(func=run)


COMPARE = (
    "netgain compare --model {model} --rate {rate:g} --slo-p99-ms {slo:g} --cpu-price-per-hour {price:g} "
    "--gpu-price-per-hour 3.50 --out runs/compare"
)


def run(args: argparse.Namespace) -> int:
    from netgain.experiments.orchestrate import ServerProcess, run_load

    os.makedirs(args.out, exist_ok=True)
    span_log = os.path.join(args.out, "spans.jsonl")
    for old in (span_log, span_log + ".1"):  # a new demo's spans only: the report joins them by id
        if os.path.isfile(old):
            os.remove(old)
    options = list(args.handler_option) or (["size=96"] if args.model == "image" else [])
    if args.model == "image" and not args.handler_option:
        print(
            "netgain demo: the image model at size 96 (96x96 inputs, to suit a small CPU; the default "
            "is 224: --handler-option size=224)",
            flush=True,
        )
    serve_args = [
        "--model",
        args.model,
        "--device",
        args.device,
        "--max-batch-size",
        str(args.max_batch_size),
        "--span-log",
        span_log,
    ]
    for opt in options:
        serve_args += ["--handler-option", opt]
    log_path = os.path.join(args.out, "server.log")
    print(f"netgain demo: starting server ({args.model} on {args.device}); log in {log_path}", flush=True)
    with ServerProcess(serve_args, log_path=log_path) as server:
        ready_s = server.wait_ready()
        print(
            f"netgain demo: server ready at {server.target} after {ready_s:.1f} s; "
            f"loading at {args.rate:g} req/s for {args.duration:g} s",
            flush=True,
        )
        rc = run_load(
            [
                "--target",
                server.target,
                "--arrival",
                "poisson",
                "--rate",
                str(args.rate),
                "--duration",
                str(args.duration),
                "--warmup-s",
                str(args.warmup_s),
                "--workers",
                str(args.workers),
                "--out",
                args.out,
                "--price-per-hour",
                str(args.price_per_hour),
                "--slo-p99-ms",
                str(args.slo_p99_ms),
            ]
        )
    if rc not in (0, 3, 4, 5):  # 5: requests failed; the report's headline says how
        raise CliError(f"netgain load failed with exit status {rc}")
    from netgain.cli import main as netgain_main

    rc = netgain_main(["report", args.out, "--span-log", span_log])
    if rc == 0:
        print(measured(args), flush=True)
    return rc


def measured(args: argparse.Namespace) -> str:
    """The demo's closing lines: what it measured (from report.json) and the command that answers
    the CPU-vs-GPU question."""
    from netgain.contract.report import read_report

    r = read_report(args.out)
    lat, cost = r["latency_ms"], r["cost_per_1k"]
    size = " (size 96)" if args.model == "image" and not args.handler_option else ""
    p99 = f"p99 {lat['p99']:.1f} ms" if lat["p99"] is not None else "no successful request"
    price = f"${cost:.4f} per 1,000 at ${args.price_per_hour:g}/h" if cost is not None else "cost unknown"
    return (
        f"netgain demo: measured {args.model}{size} on {r['device'] or args.device}: "
        f"{r['offered_rps'] or 0:.1f} req/s offered, {r['throughput_rps'] or 0:.1f}/s completed, "
        f"{p99} (SLO {args.slo_p99_ms:g} ms), {price}, "
        f"run {'VALID' if r['valid'] else 'INVALID'}; files in {args.out}/ (report.html to view)\n"
        "netgain demo: that is one side on this machine. For the CPU-vs-GPU verdict, on a host with a "
        "GPU run:\n  "
        + COMPARE.format(model=args.model, rate=args.rate, slo=args.slo_p99_ms, price=args.price_per_hour)
    )
