"""``netgain load``: open-loop (or closed-loop) load from a trace or an arrival model, on Locust."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from netgain.cli.args import CliError, flag

ARRIVALS = ("constant", "poisson", "gamma", "onoff", "diurnal")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "load",
        help="replay a trace or an arrival model against servers; write a run directory",
        description="Open-loop load on Locust: one seeded schedule, sharded over N workers, latency measured "
        "from each request's intended send time. Exit 0 ok, 3 invalid run, 4 SLO failed.",
    )
    flag(p, "--target", default=None, help="HOST:PORT[,HOST:PORT...] of netgain servers (round-robin)")
    flag(p, "--trace", default=None, help="recorded trace (CSV, JSONL or Parquet; see docs/traces.md)")
    flag(p, "--arrival", default="poisson", choices=ARRIVALS, help="arrival model when no --trace is given")
    flag(p, "--rate", type=float, default=None, help="mean requests/s (rescales a --trace; default 50)")
    flag(p, "--duration", type=float, default=30.0, help="measured seconds, after the warm-up")
    flag(p, "--warmup-s", type=float, default=5.0, help="seconds sent first, recorded, excluded from results")
    flag(p, "--workers", type=int, default=1, help="local worker processes")
    flag(p, "--remote-workers", type=int, default=0, help="extra workers expected to connect (--worker)")
    flag(p, "--out", default=None, help="run directory to write")
    flag(p, "--seed", type=int, default=0, help="seed of the schedule and payloads")
    flag(
        p,
        "--mode",
        default="open",
        choices=["open", "closed"],
        help="open loop, or closed loop (--concurrency)",
    )
    flag(p, "--concurrency", type=int, default=0, help="closed loop: requests kept in flight")
    flag(p, "--think-time-ms", type=float, default=0.0, help="closed loop: pause after each response")
    flag(p, "--cv", type=float, default=2.0, help="gamma arrivals: coefficient of variation")
    flag(p, "--on-s", type=float, default=1.0, help="onoff arrivals: burst length")
    flag(p, "--off-s", type=float, default=4.0, help="onoff arrivals: silence length")
    flag(p, "--period-s", type=float, default=60.0, help="diurnal arrivals: period")
    flag(p, "--amplitude", type=float, default=0.5, help="diurnal arrivals: relative amplitude")
    flag(p, "--size-bytes", type=int, default=0, help="payload size (0: model default)")
    flag(p, "--size-sigma", type=float, default=0.0, help="lognormal spread of payload sizes")
    flag(p, "--items", default="1", help="items per request: N or a distribution like 1:0.7,4:0.3")
    flag(p, "--model", default=None, help="payload family (default: the model the target serves)")
    flag(p, "--timeout-s", type=float, default=10.0, help="per-request deadline")
    flag(p, "--max-in-flight", type=int, default=1000, help="per worker; overflow is dropped and counted")
    flag(
        p,
        "--connections",
        type=int,
        default=1,
        help="TCP connections per worker per target (several server processes sharing one port, "
        "or an L4 balancer, spread load per connection)",
    )
    flag(
        p, "--max-send-lag-ms", type=float, default=5.0, help="send-lag p99 above this makes the run INVALID"
    )
    flag(p, "--slo-p99-ms", type=float, default=None, help="exit 4 when p99 latency is above this")
    flag(p, "--max-error-rate", type=float, default=None, help="exit 4 when the error ratio is above this")
    flag(p, "--price-per-hour", type=float, default=None, help="server price, recorded for the report")
    flag(p, "--wait-ready-s", type=float, default=30.0, help="wait this long for targets' health SERVING")
    flag(p, "--metrics-port", type=int, default=-1, help="client metrics on this port (0: any free; -1: off)")
    flag(p, "--master-bind-host", default="127.0.0.1", help="address the master listens on for workers")
    flag(p, "--master-bind-port", type=int, default=0, help="port for workers (0: any free; 5557 for remote)")
    flag(p, "--web-ui", action="store_true", default=False, help="serve Locust's web UI")
    flag(p, "--web-port", type=int, default=8089, help="Locust web UI port")
    flag(p, "--tls-ca", default=None, help="PEM CA to verify TLS targets")
    flag(
        p,
        "--probe",
        default="all",
        choices=["all", "first"],
        help="targets that must be ready before the run (first: later ones may still be starting)",
    )
    flag(p, "--quiet", action="store_true", default=False, help="no progress lines")
    flag(p, "--worker", action="store_true", default=False, help="run as a worker of a master elsewhere")
    flag(p, "--master-host", default="127.0.0.1", help="worker: the master's address")
    flag(p, "--master-port", type=int, default=5557, help="worker: the master's port")
    p.set_defaults(func=run)


def _schedule(args: argparse.Namespace) -> Any:
    from netgain.loadgen.schedule import from_trace
    from netgain.loadgen.traces import read_trace, rescale, synthesize

    total = args.warmup_s + args.duration
    if args.trace:
        trace = read_trace(args.trace)
        if len(trace) == 0:
            raise CliError(f"--trace {args.trace}: no requests in it")
        trace = rescale(trace, rate=args.rate, duration_s=total)
    else:
        trace = synthesize(
            args.arrival,
            args.rate or 50.0,
            total,
            args.seed,
            cv=args.cv,
            on_s=args.on_s,
            off_s=args.off_s,
            period_s=args.period_s,
            amplitude=args.amplitude,
            size_bytes=args.size_bytes,
            size_sigma=args.size_sigma,
            items=int(args.items) if args.items.isdigit() else args.items,
        )
    return from_trace(trace, args.warmup_s)


def _check(args: argparse.Namespace) -> None:
    if not args.target:
        raise CliError("--target HOST:PORT is required (the address `netgain serve` printed)")
    if not args.out:
        raise CliError("--out RUN_DIR is required")
    if args.workers < 0 or args.workers + args.remote_workers < 1:
        raise CliError("--workers must be >= 1 (or --remote-workers >= 1)")
    if args.duration <= 0 or args.warmup_s < 0:
        raise CliError("--duration must be > 0 and --warmup-s >= 0")
    if args.mode == "closed" and args.concurrency < 1:
        raise CliError("--mode closed needs --concurrency N (N >= 1)")
    if args.rate is not None and args.rate <= 0:
        raise CliError("--rate must be > 0")


def run(args: argparse.Namespace) -> int:
    import locust  # noqa: F401 - patches the standard library for gevent before grpc is used
    from grpc.experimental import gevent as grpc_gevent  # type: ignore[attr-defined]

    grpc_gevent.init_gevent()
    if args.worker:
        from netgain.loadgen.runner.worker import run_worker

        return run_worker(args.master_host, args.master_port)
    _check(args)
    from netgain.loadgen.runner.master import LoadConfig, Master

    cfg = LoadConfig(
        targets=[t.strip() for t in args.target.split(",") if t.strip()],
        out=args.out,
        workers=args.workers,
        remote_workers=args.remote_workers,
        master_bind_host=args.master_bind_host,
        master_bind_port=args.master_bind_port,
        mode=args.mode,
        concurrency=args.concurrency,
        think_ms=args.think_time_ms,
        warmup_s=args.warmup_s,
        duration_s=args.duration,
        timeout_s=args.timeout_s,
        max_in_flight=args.max_in_flight,
        connections=args.connections,
        seed=args.seed,
        model=args.model,
        metrics_port=args.metrics_port,
        web_ui=args.web_ui,
        web_port=args.web_port,
        max_send_lag_ms=args.max_send_lag_ms,
        slo_p99_ms=args.slo_p99_ms,
        max_error_rate=args.max_error_rate,
        price_per_hour=args.price_per_hour,
        wait_ready_s=args.wait_ready_s,
        tls_ca=args.tls_ca,
        probe=args.probe,
        quiet=args.quiet,
        command=["netgain", *sys.argv[1:]],
    )
    return Master(cfg, _schedule(args)).run()
