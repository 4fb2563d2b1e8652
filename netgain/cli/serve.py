"""``netgain serve`` (and ``python -m netgain.server``): flags → ServeConfig → server. Heavy imports
happen after parsing, so the cold-start timeline can show what importing torch and grpc costs."""

from __future__ import annotations

import argparse
import errno
import sys
import time
from collections.abc import Sequence
from typing import Any

from netgain.cli.args import CliError, OneLineParser, debug_after_command, flag, key_values
from netgain.server.eventloop import KINDS

MIB = 1024 * 1024


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the gRPC (and, with --http-port, REST) inference server",
        description="Serve a model over gRPC (and KServe v2 REST with --http-port) on cpu or cuda, batching "
        "dynamically, with per-request spans.",
    )
    flag(
        p,
        "--model",
        default="image",
        help="built-in model (image, text, tabular, null; resnet50, bert-base at real size) or "
        "module:Class of your own Handler",
    )
    flag(p, "--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when available)")
    flag(
        p,
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="autocast dtype of the forward pass",
    )
    flag(p, "--host", default="127.0.0.1", help="address to bind (loopback unless you say otherwise)")
    flag(p, "--port", type=int, default=50051, help="gRPC port (0: any free port)")
    flag(p, "--metrics-port", type=int, default=9464, help="Prometheus /metrics port (0: any free, -1: off)")
    flag(
        p,
        "--http-port",
        type=int,
        default=-1,
        help="also serve KServe v2 REST (the Open Inference Protocol over HTTP, phases in a Server-Timing "
        "header) on this port (0: any free port; -1: off)",
    )
    flag(p, "--max-batch-size", type=int, default=8, help="most items per device batch")
    flag(
        p,
        "--max-queue-delay-ms",
        type=float,
        default=2.0,
        help="longest a batch waits for companions, counted from its first request",
    )
    flag(p, "--max-queue-size", type=int, default=256, help="requests waiting before new ones are shed")
    flag(p, "--instances", type=int, default=1, help="model instances (device workers), one stream each")
    flag(
        p,
        "--workers",
        default="auto",
        help="frontend processes (gRPC + pre/post) feeding one device process through shared memory; "
        "0: everything in one process; auto: on the CPU 2, on a GPU split with --pre-processes; "
        "one process below 4 cores",
    )
    flag(
        p,
        "--pre-processes",
        default="auto",
        help="processes that only pre-process, taking requests from every frontend (0: the frontends' "
        "--pre-threads do it); auto: on a GPU one process per core, split between frontends and these "
        "by the handler's pre-processing time, timed at start-up; 0 on the CPU",
    )
    flag(
        p,
        "--slots-per-worker",
        type=int,
        default=0,
        help="shared-memory hand-off slots per frontend, one per item in flight (0: from the batch size)",
    )
    flag(p, "--pre-threads", type=int, default=2, help="threads for pre- and post-processing")
    flag(
        p,
        "--worker-nice",
        type=int,
        default=0,
        help="niceness the frontend and pre-processing processes add to their own, so the device "
        "process gets a core first when they keep every core busy (default 0: the same priority)",
    )
    flag(
        p,
        "--device-cores",
        default="auto",
        help="cores the device process runs on alone, the highest-numbered usable ones; the frontends, "
        "pre-processing processes and supervisor run on the others; auto: 1 on a GPU host of 8 cores or "
        "more when pre-processed items are small (at most 16 KiB), else 0 (every process may use every core)",
    )
    flag(
        p,
        "--pin-pre-processes",
        action="store_true",
        help="run each pre-processing process on one core of its own (in turn over the cores the "
        "device process does not keep), as the ceiling's pre-processing loop runs; the frontends float",
    )
    flag(
        p,
        "--intra-op-threads",
        type=int,
        default=0,
        help="torch intra-op threads (0: all usable cores; with --workers the device process "
        "takes 1 on a GPU, the cores the frontends leave on the CPU)",
    )
    flag(p, "--max-message-mb", type=float, default=16.0, help="largest request or response message")
    flag(p, "--max-items-per-request", type=int, default=256, help="most inputs in one request")
    flag(p, "--span-log", default=None, help="write one JSON line per request to this file")
    flag(p, "--span-log-max-mb", type=float, default=0.0, help="rotate the span log to FILE.1 past this size")
    flag(
        p,
        "--otlp-endpoint",
        default=None,
        help="export each request's phases as OpenTelemetry spans to this OTLP/HTTP receiver "
        "(http://host:4318; POST /v1/traces), continuing the client's W3C traceparent",
    )
    flag(
        p,
        "--warmup-batches",
        type=int,
        default=3,
        help="warm-up rounds before health turns SERVING (on CUDA the first runs every batch size; 0: none)",
    )
    flag(
        p,
        "--handler-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option for the handler, e.g. size=128 (repeatable)",
    )
    flag(p, "--seed", type=int, default=0, help="seed of the model weights and warm-up payloads")
    flag(p, "--tls-cert", default=None, help="PEM certificate chain: serve TLS")
    flag(p, "--tls-key", default=None, help="PEM private key for --tls-cert")
    flag(p, "--tls-client-ca", default=None, help="PEM CA: require client certificates (mTLS)")
    flag(p, "--profile-dir", default=None, help="allow Profile RPC captures, written here")
    flag(p, "--nvtx", action="store_true", default=False, help="NVTX ranges per phase (for Nsight Systems)")
    flag(
        p,
        "--cuda-graphs",
        action="store_true",
        default=False,
        help="replay the forward pass as CUDA graphs, one per power-of-two batch (fixed-shape handlers)",
    )
    flag(
        p,
        "--no-instrumentation",
        action="store_true",
        default=False,
        help="no trailers' spans, no histograms (to measure instrumentation overhead)",
    )
    flag(p, "--sample-interval-s", type=float, default=1.0, help="CPU/GPU sampling period")
    flag(
        p,
        "--recorder-interval-s",
        type=float,
        default=0.05,
        help="how often finished requests become histogram observations and span-log lines",
    )
    flag(p, "--ports-file", default=None, help="write the bound ports as JSON here once listening")
    flag(p, "--grace-s", type=float, default=30.0, help="time to finish in-flight requests on SIGTERM")
    flag(
        p,
        "--receive-timeout-s",
        type=float,
        default=30.0,
        help="a request's message must arrive within this after its headers; a later one gets "
        "DEADLINE_EXCEEDED and what it sent is freed",
    )
    flag(
        p,
        "--switch-interval-ms",
        type=float,
        default=1.0,
        help="Python GIL switch interval; lower than the default 5 ms so the device thread resumes promptly",
    )
    flag(
        p,
        "--event-loop",
        default="auto",
        choices=KINDS,
        help="the gRPC processes' event loop: auto is uvloop where installed (fewer instructions per "
        "request), else asyncio's",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from netgain.server.config import ServeConfig

    cfg = ServeConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        http_port=args.http_port,
        max_batch_size=args.max_batch_size,
        max_queue_delay_ms=args.max_queue_delay_ms,
        max_queue_size=args.max_queue_size,
        instances=args.instances,
        pre_threads=args.pre_threads,
        workers=args.workers,
        pre_processes=args.pre_processes,
        worker_nice=args.worker_nice,
        device_cores=args.device_cores,
        pin_pre_processes=args.pin_pre_processes,
        slots_per_worker=args.slots_per_worker,
        intra_op_threads=args.intra_op_threads,
        max_message_bytes=int(args.max_message_mb * MIB),
        max_items_per_request=args.max_items_per_request,
        span_log=args.span_log,
        span_log_max_bytes=int(args.span_log_max_mb * MIB),
        otlp_endpoint=args.otlp_endpoint,
        warmup_batches=args.warmup_batches,
        handler_options=key_values(args.handler_option, "--handler-option"),
        seed=args.seed,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        profile_dir=args.profile_dir,
        nvtx=args.nvtx,
        cuda_graphs=args.cuda_graphs,
        instrumentation=not args.no_instrumentation,
        sample_interval_s=args.sample_interval_s,
        recorder_interval_s=args.recorder_interval_s,
        ports_file=args.ports_file,
        grace_s=args.grace_s,
        receive_timeout_s=args.receive_timeout_s,
        switch_interval_ms=args.switch_interval_ms,
        event_loop=args.event_loop,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    entered = time.time()
    from netgain.server.coldstart import ColdStart

    cold = ColdStart()
    cold.mark("process_start", entered)
    cfg = config_from_args(args)
    import torch  # imported here so the "imports" phase includes it

    from netgain.server.app import run_server
    from netgain.server.handlers.check import check_handler

    cold.mark("imports")
    # The check below runs torch ops: with one thread they start no OpenMP pool, which a forked
    # --workers process would inherit without its threads and deadlock in (each layout sets its own).
    torch.set_num_threads(1)
    try:  # a handler that cannot serve is said in one line, before any server process starts
        check_handler(cfg.model, cfg.handler_options, cfg.seed)
    except ValueError as exc:
        raise CliError(f"--model {cfg.model}: {exc}") from None
    try:
        return run_server(cfg, cold)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        # The gRPC port's bind error names it; prometheus_client's for the metrics port is a bare
        # "[Errno 98] Address already in use".
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise CliError(
                f"--metrics-port {cfg.metrics_port}: cannot serve /metrics on {cfg.host}:{cfg.metrics_port}: "
                f"{exc.strerror} (another server there? --metrics-port 0 takes any free port, -1 none)"
            ) from None
        raise


def standalone_main(argv: Sequence[str] | None = None) -> int:
    """``python -m netgain.server [serve flags]``: the server alone, same flags as ``netgain serve``."""
    parser = OneLineParser(prog="python -m netgain.server")
    parser.add_argument("--debug", action="store_true")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    debug_after_command(sub)
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    from netgain.cli import dispatch

    return dispatch(parser, args)
