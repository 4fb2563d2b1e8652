"""``netgain load``: open-loop (or closed-loop) load from a trace or an arrival model, on Locust."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from netgain.cli.args import CliError, flag
from netgain.contract.rundir import DEFAULT_MAX_SEND_LAG_MS

ARRIVALS = ("constant", "poisson", "gamma", "onoff", "diurnal")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "load",
        help="replay a trace or an arrival model against servers; write a run directory",
        description="Open-loop load on Locust: one seeded schedule, sharded over N workers, latency measured "
        "from each request's intended send time. Exit 0 ok, 2 usage error, 3 invalid run, 4 SLO failed, "
        "5 requests failed (the target went away or refused them, or none succeeded), 130 interrupted "
        "(Ctrl-C: every row and meta.json written, the run marked partial).",
    )
    flag(p, "--target", default=None, help="HOST:PORT[,HOST:PORT...] of netgain servers (round-robin)")
    flag(p, "--trace", default=None, help="recorded trace (CSV, JSONL or Parquet; see docs/traces.md)")
    flag(p, "--arrival", default="poisson", choices=ARRIVALS, help="arrival model when no --trace is given")
    flag(p, "--rate", type=float, default=None, help="mean requests/s (rescales a --trace; default 50)")
    flag(
        p,
        "--duration",
        type=float,
        default=None,
        help="measured seconds, after the warm-up (default 30; with --trace: the trace's own length, "
        "so it replays whole; longer loops it, shorter cuts it, both said on stderr)",
    )
    flag(p, "--warmup-s", type=float, default=5.0, help="seconds sent first, recorded, excluded from results")
    flag(p, "--workers", type=int, default=1, help="local worker processes")
    flag(p, "--remote-workers", type=int, default=0, help="extra workers expected to connect (--worker)")
    flag(p, "--out", default=None, help="run directory to write (a new one, unless --force)")
    flag(
        p,
        "--force",
        action="store_true",
        default=False,
        help="write into an existing run directory, deleting its run files and reports first",
    )
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
    flag(
        p,
        "--protocol",
        default="netgain",
        choices=["netgain", "oip", "oip-http", "http-json"],
        help="netgain: netgain.v1 (netgain serve); oip: the Open Inference Protocol, KServe v2 gRPC "
        "(Triton, KServe, MLServer, netgain serve): the input tensor comes from ModelMetadata; "
        "oip-http: the same over KServe v2 REST (HTTP/1.1, JSON or binary tensors); http-json: any "
        "HTTP endpoint, requests from --request-template",
    )
    flag(
        p,
        "--oip-model",
        default=None,
        help="with --protocol oip or oip-http: the model name requests carry (default: --model)",
    )
    flag(
        p,
        "--oip-binary",
        default=None,
        choices=["auto", "always", "never"],
        help="with --protocol oip-http: send tensors with the binary-data extension (auto: BYTES "
        "tensors and FP32 ones over 64 KiB of JSON; never: JSON only, BYTES must be UTF-8 text)",
    )
    flag(
        p,
        "--request-template",
        default=None,
        help="with --protocol http-json: a JSON (or YAML) file with method, path, headers, body (the "
        'payload put in by placeholders, e.g. {"image": "{payload_b64}"}), expect_status, ready_path '
        "(docs/loadgen.md)",
    )
    flag(
        p,
        "--payload-variants",
        type=int,
        default=8,
        help="distinct payloads per size bucket (request i uses variant i mod N; sizes are bucketed "
        "to two significant digits)",
    )
    flag(p, "--timeout-s", type=float, default=10.0, help="per-request deadline")
    flag(p, "--max-in-flight", type=int, default=1000, help="per worker; overflow is dropped and counted")
    flag(
        p,
        "--connections",
        type=int,
        default=1,
        help="TCP connections per worker per target (several server processes sharing one port, "
        "or an L4 balancer, spread load per connection); HTTP: opened before the run, and more as "
        "requests overlap (one request per connection at a time)",
    )
    flag(
        p,
        "--max-send-lag-ms",
        type=float,
        default=DEFAULT_MAX_SEND_LAG_MS,
        help="send-lag p99 above this makes the run INVALID",
    )
    flag(p, "--slo-p99-ms", type=float, default=None, help="exit 4 when p99 latency is above this")
    flag(
        p,
        "--max-error-rate",
        type=float,
        default=None,
        help="exit 4 when the error ratio is above this (without it, any failed request exits 5; a run "
        "in which none succeeded exits 5 either way)",
    )
    flag(p, "--price-per-hour", type=float, default=None, help="server price, recorded for the report")
    flag(
        p,
        "--wait-ready-s",
        type=float,
        default=None,
        help="wait this long for targets' health SERVING (default 30; a refused connection fails "
        "after 2 s unless this is given: then it too is waited for, as for a server starting)",
    )
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


def _schedule(args: argparse.Namespace) -> tuple[Any, float, str]:
    """The schedule, the measured seconds, and what was done to a --trace ("" when nothing was:
    a recorded trace replays whole and exactly unless --rate or --duration asks otherwise)."""
    from netgain.loadgen import stream
    from netgain.loadgen.traces import read_trace, rescale

    duration = args.duration
    note = ""
    if args.trace:
        trace = read_trace(args.trace)
        if len(trace) == 0:
            raise CliError(f"--trace {args.trace}: no requests in it")
        fitted, duration, note = _fit_trace(trace, args, rescale)
        if isinstance(fitted, stream.StreamedSchedule):
            return fitted, duration, note
        return stream.from_trace(fitted, args.warmup_s), duration, note
    duration = 30.0 if duration is None else duration
    # Streamed: made a chunk at a time as the run advances (the same requests as synthesize).
    schedule = stream.synthesize(
        args.arrival,
        args.rate or 50.0,
        args.warmup_s + duration,
        args.seed,
        cv=args.cv,
        on_s=args.on_s,
        off_s=args.off_s,
        period_s=args.period_s,
        amplitude=args.amplitude,
        size_bytes=args.size_bytes,
        size_sigma=args.size_sigma,
        items=int(args.items) if args.items.isdigit() else args.items,
        warmup_s=args.warmup_s,
    )
    return schedule, duration, note


def _fit_trace(trace: Any, args: argparse.Namespace, rescale: Any) -> tuple[Any, float, str]:
    """A recorded trace as the run will send it: whole (its length is its last arrival, or one mean
    gap more: a 60 s recording whose last request is at 59.99 s fills --duration 60), time-scaled
    by --rate, cut or looped to --warmup-s + --duration. Returns (trace, measured s, note); the
    trace is a streamed schedule already when it was cut or looped."""
    from netgain.loadgen import stream

    n, length = len(trace), trace.duration_s
    gap = length / (n - 1) if n > 1 else 0.0
    src = f"--trace {args.trace} ({n} requests over {length:.3f} s)"
    if args.rate is not None:
        if args.duration is None:
            trace = rescale(trace, rate=args.rate)
            note = f"{src}: time scaled x{trace.duration_s / max(length, 1e-12):.4g} to {args.rate:g} req/s"
        else:
            total = args.warmup_s + args.duration
            trace = stream.rescaled(trace, args.warmup_s, rate=args.rate, duration_s=total)
            what = "looped and " if len(trace) > n else ("cut and " if len(trace) < n else "")
            note = f"{src}: {what}time-scaled to {len(trace)} requests, {args.rate:g} req/s over {total:g} s"
            return trace, args.duration, note
        length = trace.duration_s
        gap = length / (len(trace) - 1) if len(trace) > 1 else 0.0
    else:
        note = ""
    if args.duration is None:
        if length <= args.warmup_s:
            raise CliError(
                f"--warmup-s {args.warmup_s:g} leaves nothing to measure of the {length:g} s trace "
                "(lower it, or give --duration to loop the trace)"
            )
        return trace, length - args.warmup_s, note
    total = args.warmup_s + args.duration
    if length <= total <= length + gap:  # the trace fills the run: replayed whole, nothing appended
        return trace, args.duration, note
    before = len(trace)
    # Looped lazily: the streamed schedule repeats the trace a copy at a time (loadgen/stream.py).
    trace = stream.rescaled(trace, args.warmup_s, duration_s=total)
    span = f"{total:g} s (--warmup-s {args.warmup_s:g} + --duration {args.duration:g})"
    if total < length:
        how = f"cut to its first {span}: {len(trace)} of {before} requests"
    else:
        how = f"looped to fill {span}: {len(trace)} requests, {len(trace) / before:.2f} times the trace"
    return trace, args.duration, (note + "; " if note else f"{src}: ") + how


def _target_error(target: str) -> str | None:
    host, sep, port = target.rpartition(":")
    if not sep or not host.strip("[]"):
        return f"--target {target!r}: expected HOST:PORT"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"--target {target!r}: port {port!r} is not a number from 1 to 65535"
    return None


def _check(args: argparse.Namespace) -> None:
    if not args.target:
        raise CliError("--target HOST:PORT is required (the address `netgain serve` printed)")
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    if not targets:
        raise CliError(f"--target {args.target!r}: expected HOST:PORT[,HOST:PORT...]")
    for t in targets:
        problem = _target_error(t)
        if problem:
            raise CliError(problem)
    if not args.out:
        raise CliError("--out RUN_DIR is required")
    if args.workers < 0 or args.workers + args.remote_workers < 1:
        raise CliError("--workers must be >= 1 (or --remote-workers >= 1)")
    if (args.duration is not None and args.duration <= 0) or args.warmup_s < 0:
        raise CliError("--duration must be > 0 and --warmup-s >= 0")
    if args.mode == "closed" and args.concurrency < 1:
        raise CliError("--mode closed needs --concurrency N (N >= 1)")
    if args.rate is not None and args.rate <= 0:
        raise CliError("--rate must be > 0")
    _check_protocol(args, targets)
    if args.payload_variants < 1:
        raise CliError(f"--payload-variants must be >= 1, got {args.payload_variants}")
    if args.wait_ready_s is not None and args.wait_ready_s < 0:
        raise CliError("--wait-ready-s must be >= 0")
    _check_out(args.out, args.force)


def _max_items(items: str) -> int:
    """The most items a request carries, from --items (N, or a distribution like 1:0.7,4:0.3)."""
    try:
        return max(int(part.split(":")[0]) for part in items.split(","))
    except ValueError:
        return 1  # the schedule's own parsing says what is wrong with it


def _check_protocol(args: argparse.Namespace, targets: list[str]) -> None:
    from netgain.contract.payloads import BUILTIN

    protocol = args.protocol
    oip = protocol in ("oip", "oip-http")
    if oip:
        if not (args.oip_model or args.model):
            raise CliError(
                f"--protocol {protocol} needs --oip-model NAME (the served model), --model (payloads)"
            )
        if not args.model and args.oip_model not in BUILTIN:
            raise CliError(
                f"--protocol {protocol}: which payloads suit model {args.oip_model!r}? say --model "
                f"{'|'.join(sorted(BUILTIN))} or module:Class"
            )
    elif args.oip_model:
        raise CliError("--oip-model needs --protocol oip or oip-http")
    if args.oip_binary and protocol != "oip-http":
        raise CliError("--oip-binary needs --protocol oip-http")
    if args.oip_binary == "never" and (args.model or args.oip_model) in ("image", "null", "resnet50"):
        raise CliError(
            "--oip-binary never sends tensors as JSON, and these payloads are bytes, not text: "
            "image and null need the binary-data extension (--oip-binary auto)"
        )
    if protocol in ("oip-http", "http-json"):
        for t in targets:
            if t.startswith("dns:") or "://" in t:
                raise CliError(
                    f"--target {t!r}: --protocol {protocol} takes HOST:PORT (https: give --tls-ca; "
                    "dns: round-robin is gRPC's)"
                )
    if protocol != "http-json":
        if args.request_template:
            raise CliError("--request-template needs --protocol http-json")
        return
    if not args.request_template:
        raise CliError("--protocol http-json needs --request-template FILE (its method, path, body...)")
    if not args.model:
        raise CliError(
            f"--protocol http-json: which payloads go into the template? say --model "
            f"{'|'.join(sorted(BUILTIN))} or module:Class"
        )
    from netgain.loadgen.http_requests import check_template, load_template

    try:
        args.request_doc = load_template(args.request_template)
        features = (args.model == "tabular") if args.model in BUILTIN else None
        check_template(args.request_doc, features, _max_items(args.items))
    except ValueError as exc:
        raise CliError(str(exc) if str(exc).startswith("--") else f"--request-template: {exc}") from None


def _check_out(out: str, force: bool) -> None:
    """--out must be a directory that holds no run yet (--force: its run files are deleted)."""
    from netgain.contract import rundir as files

    if os.path.exists(out) and not os.path.isdir(out):
        raise CliError(f"--out {out}: is a file, not a directory; give a run directory to create")
    names = (files.META, files.REQUESTS, files.SAMPLES, files.LOCUST_STATS, files.LOCUST_FAILURES)
    present = [n for n in (*names, *files.REPORT_FILES) if os.path.exists(os.path.join(out, n))]
    if not any(n in present for n in names):
        present = [n for n in present if n in names]  # a lone report is a leftover: replaced below
    if present and not force:
        raise CliError(
            f"--out {out}: already holds a run ({', '.join(present)}); choose a new directory, "
            "or pass --force to replace it"
        )
    for n in (*names, *files.REPORT_FILES):  # no old report is left beside the new rows
        path = os.path.join(out, n)
        if os.path.isfile(path):
            os.remove(path)


def run(args: argparse.Namespace) -> int:
    if not args.worker:
        _check(args)  # before Locust's import patches the standard library: errors come at once
    import locust  # noqa: F401 - patches the standard library for gevent before grpc is used
    from grpc.experimental import gevent as grpc_gevent  # type: ignore[attr-defined]

    grpc_gevent.init_gevent()
    if args.worker:
        from netgain.loadgen.runner.worker import run_worker

        return run_worker(args.master_host, args.master_port)
    from netgain.loadgen.runner.master import LoadConfig, Master

    schedule, duration, note = _schedule(args)
    if note:  # cutting, compressing or looping a recorded trace is said, --quiet or not
        print(f"netgain load: {note}", file=sys.stderr, flush=True)
    elif args.trace and not args.quiet:
        print(
            f"netgain load: --trace {args.trace}: replayed whole ({len(schedule)} requests over "
            f"{args.warmup_s + duration:g} s, --warmup-s {args.warmup_s:g} of it)",
            file=sys.stderr,
            flush=True,
        )

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
        duration_s=duration,
        timeout_s=args.timeout_s,
        max_in_flight=args.max_in_flight,
        connections=args.connections,
        seed=args.seed,
        model=args.model or (args.oip_model if args.protocol in ("oip", "oip-http") else None),
        metrics_port=args.metrics_port,
        web_ui=args.web_ui,
        web_port=args.web_port,
        max_send_lag_ms=args.max_send_lag_ms,
        slo_p99_ms=args.slo_p99_ms,
        max_error_rate=args.max_error_rate,
        price_per_hour=args.price_per_hour,
        wait_ready_s=30.0 if args.wait_ready_s is None else args.wait_ready_s,
        refused_grace_s=2.0 if args.wait_ready_s is None else None,
        payload_variants=args.payload_variants,
        tls_ca=args.tls_ca,
        protocol=args.protocol,
        oip_model=(args.oip_model or args.model) if args.protocol in ("oip", "oip-http") else None,
        oip_binary=args.oip_binary or "auto",
        request_template=getattr(args, "request_doc", None),
        probe=args.probe,
        quiet=args.quiet,
        command=["netgain", *sys.argv[1:]],
    )
    return Master(cfg, schedule).run()
