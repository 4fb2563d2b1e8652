"""What every process of ``netgain serve`` builds the same way, in either layout.

The one-process server (``app.py``) and the ``--workers`` processes (``multiproc/``: the
supervisor, the frontends, the device process) take their parts from here: the model's runners
and warm-up, the metrics registry with its recorder, tracing and sampler, the /metrics endpoint,
the servicer, health and the gRPC server, the drain, the static metrics, the ports line and
the ServerInfo answer.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from netgain.contract.cores import cpu_model
from netgain.protos import inference_pb2 as pb
from netgain.protos.service import SERVICE_NAME, add_inference_servicer, add_oip_servicer
from netgain.server import eventloop
from netgain.server.coldstart import ColdStart
from netgain.server.config import ServeConfig
from netgain.server.device import DeviceRunner
from netgain.server.handlers import create_handler
from netgain.server.handlers.base import Handler
from netgain.server.oip import ModelIO, OipServicer, model_io
from netgain.server.receive_deadline import ReceiveDeadline
from netgain.server.service import MAX_METADATA_BYTES, InferenceServicer, Limits
from netgain.server.telemetry.metrics import ServerMetrics
from netgain.server.telemetry.otlp import build_tracing
from netgain.server.telemetry.recorder import Recorder, SpanLog
from netgain.server.telemetry.samplers import Sampler


@functools.cache
def versions() -> dict[str, str]:
    """Library and driver versions; read once (ServerInfo and metrics ask often)."""
    import google.protobuf
    import torch

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "grpc": grpc.__version__,
        "protobuf": google.protobuf.__version__,
        "cuda": str(torch.version.cuda or ""),
        # The hardware beside the versions: runs on machines of one kind can differ several-fold.
        "cpu": cpu_model(),
        # The vector instructions torch's CPU kernels use here (AVX512, AVX2, DEFAULT: none): a
        # virtual machine may hide them, which slows a CPU forward several-fold.
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            out["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            out["driver"] = ""
    return out


# -- the model -------------------------------------------------------------------------------------


def build_handler(cfg: ServeConfig) -> Handler:
    """The served model's handler (--model, --handler-option, --seed): each process builds its own."""
    return create_handler(cfg.model, cfg.handler_options, cfg.seed)


def build_runners(handler: Handler, device: str, cfg: ServeConfig) -> list[DeviceRunner]:
    """One runner per --instances (their models are built and placed by the caller)."""
    return [DeviceRunner(handler, device, cfg.dtype, cfg.nvtx, cfg.cuda_graphs) for _ in range(cfg.instances)]


def warmup_sizes(runner: DeviceRunner, max_batch_size: int) -> list[int]:
    """The batch sizes a first warm-up round runs: on CUDA every size the batcher can form (a shape
    seen first while serving costs a kernel choice and lazy module loads, tens of ms for a
    convolutional model); elsewhere the smallest and largest (new shapes cost the CPU little)."""
    if runner.cuda_graphs:
        return sorted({min(2**k, max_batch_size) for k in range(max_batch_size.bit_length() + 1)})
    if runner.is_cuda and runner.handler.uses_device:
        return list(range(1, max_batch_size + 1))
    return sorted({1, max_batch_size})


def warm_up(handler: Handler, runner: DeviceRunner, cfg: ServeConfig) -> None:
    """Run batches of example payloads so first requests do not pay for lazy initialisation: one
    round of ``warmup_sizes`` (with CUDA graphs, every power-of-two bucket is captured), then the
    smallest and largest batch for the rest of --warmup-batches (0: no warm-up at all)."""
    if cfg.warmup_batches < 1:
        return
    rng = random.Random(cfg.seed)
    items = [handler.preprocess(handler.example_input(rng)) for _ in range(cfg.max_batch_size)]
    rounds = [warmup_sizes(runner, cfg.max_batch_size)]
    rounds += [sorted({1, cfg.max_batch_size})] * (cfg.warmup_batches - 1)
    for sizes in rounds:
        for size in sizes:
            runner.run(runner.prepare(handler.collate(items[:size])))


# -- telemetry -------------------------------------------------------------------------------------


def gpu_index(device: str) -> int | None:
    """The CUDA device's index for the GPU sampler; None off the GPU."""
    if not device.startswith("cuda"):
        return None
    return int(device.split(":")[1]) if ":" in device else 0


@dataclass
class Telemetry:
    """A process's metrics registry and what records into it."""

    registry: CollectorRegistry
    metrics: ServerMetrics
    recorder: Recorder
    tracer: Any  # a TraceBuilder with --otlp-endpoint, else None
    span_log: SpanLog | None
    sampler: Sampler
    instrumented: bool

    @property
    def servicer_recorder(self) -> Recorder | None:
        """The recorder the servicer reports requests to: None when nothing would keep them."""
        if self.instrumented or self.span_log or self.tracer:
            return self.recorder
        return None

    def start(self) -> None:
        self.recorder.start()
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        self.recorder.stop()


def build_telemetry(
    cfg: ServeConfig,
    model: str,
    device: str,
    *,
    runs_model: bool,
    span_log: bool,
    per_request_phases: bool = False,
) -> Telemetry:
    """Registry, metrics, tracing, recorder and sampler. ``runs_model``: this process runs the
    --instances (it samples them and the GPU); ``span_log``: it writes --span-log."""
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, model, device)
    spans = SpanLog(cfg.span_log, cfg.span_log_max_bytes) if span_log and cfg.span_log else None
    counted = metrics if cfg.instrumentation else None
    tracer, exporter = build_tracing(cfg.otlp_endpoint, counted, model, device)
    recorder = Recorder(
        counted,
        spans,
        cfg.recorder_interval_s,
        per_request_phases=per_request_phases,
        tracer=tracer,
        exporter=exporter,
    )
    sampler = Sampler(
        metrics,
        cfg.instances if runs_model else 0,
        gpu_index(device) if runs_model else None,
        cfg.sample_interval_s,
    )
    return Telemetry(registry, metrics, recorder, tracer, spans, sampler, cfg.instrumentation)


def serve_metrics(registry: CollectorRegistry, port: int, host: str) -> tuple[Any, int]:
    """The /metrics HTTP server for ``registry`` and the port it listens on (0: a free one)."""
    httpd, _ = start_http_server(port, addr=host, registry=registry)
    return httpd, int(httpd.server_port)


def publish_static(metrics: ServerMetrics, cfg: ServeConfig, cold: ColdStart, torch_version: str) -> None:
    """Once ready: the cold-start phases, ready = 1 and the server's info labels."""
    m = metrics
    for name, _, duration in cold.timeline():
        m.cold_start.labels(**m.labels, phase=name).set(duration)
    m.ready.labels(**m.labels).set(1)
    m.info.labels(**m.labels).info(
        {
            "dtype": cfg.dtype,
            "torch": torch_version,
            "max_batch_size": str(cfg.max_batch_size),
            "instances": str(cfg.instances),
        }
    )


def write_ports(cfg: ServeConfig, grpc_port: int, metrics_port: int, http_port: int = -1) -> None:
    """The ports line on stdout and, with --ports-file, the same as JSON (replaced atomically;
    -1 for an endpoint that is off)."""
    line = f"netgain serve: grpc {cfg.host}:{grpc_port}"
    if http_port >= 0:
        line += f", http http://{cfg.host}:{http_port}"
    if metrics_port >= 0:
        line += f", metrics http://{cfg.host}:{metrics_port}/metrics"
    print(line, flush=True)
    if cfg.ports_file:
        tmp = cfg.ports_file + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"grpc": grpc_port, "metrics": metrics_port, "http": http_port, "pid": os.getpid()}, fh)
        os.replace(tmp, cfg.ports_file)


# -- gRPC ------------------------------------------------------------------------------------------


def build_servicer(
    cfg: ServeConfig,
    model: str,
    requests: Any,
    telemetry: Telemetry,
    max_items: int,
    info: Callable[[], pb.ServerInfoResponse],
    profile: Callable[..., Any],
) -> InferenceServicer:
    """The inference servicer over ``requests`` (the request queue, or a frontend's hand-off)."""
    return InferenceServicer(
        model,
        requests,
        telemetry.servicer_recorder,
        Limits(max_items, cfg.max_message_bytes),
        info,
        profile,
        instrumented=cfg.instrumentation,
    )


def new_health() -> Any:
    return health.aio.HealthServicer()  # type: ignore[attr-defined]


async def set_health(health_servicer: Any, serving: bool) -> None:
    """The overall status and the inference service's, both SERVING or both NOT_SERVING."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)


def credentials(cfg: ServeConfig) -> Any:
    if not cfg.tls_cert:
        return None
    with open(cfg.tls_cert, "rb") as fh:
        cert = fh.read()
    with open(cfg.tls_key or "", "rb") as fh:
        key = fh.read()
    ca = None
    if cfg.tls_client_ca:
        with open(cfg.tls_client_ca, "rb") as fh:
            ca = fh.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


MAX_CONNECTION_AGE_S = 300.0
MAX_CONNECTION_AGE_ENV = "NETGAIN_GRPC_MAX_CONNECTION_AGE_S"


def max_connection_age_s() -> float:
    """A connection's age before GOAWAY: 300 s, or NETGAIN_GRPC_MAX_CONNECTION_AGE_S (> 0; the
    reliability tests shorten it)."""
    raw = os.environ.get(MAX_CONNECTION_AGE_ENV, "")
    try:
        value = float(raw) if raw else MAX_CONNECTION_AGE_S
    except ValueError:
        value = MAX_CONNECTION_AGE_S
    return value if value > 0 else MAX_CONNECTION_AGE_S


def oip_io(cfg: ServeConfig) -> ModelIO:
    """The served model's Open Inference Protocol tensors, from its handler's example payload (a
    throwaway instance: no model is built)."""
    return model_io(create_handler(cfg.model, cfg.handler_options))


async def start_grpc(
    cfg: ServeConfig, servicer: Any, health_servicer: Any, io: ModelIO | None = None
) -> tuple[grpc.aio.Server, int]:
    """The gRPC server (inference, health NOT_SERVING, reflection) listening on cfg's address;
    ``io``: the model's OIP tensors (``oip_io``) when the caller has them already."""
    opts = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        # Advertised as SETTINGS_MAX_HEADER_LIST_SIZE; the servicer refuses larger metadata from a
        # client that never acknowledged it (gRPC enforces it only after the acknowledgement).
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        # Only processes of one `netgain serve` share a port: ports.claim_port refused it first otherwise.
        ("grpc.so_reuseport", 1),
        # Calls gRPC has accepted but the event loop has not picked up yet. gRPC's defaults
        # (1,000, hard 3,000) reset streams under a burst, which clients see as CANCELLED
        # instead of the server's own queue shedding them with RESOURCE_EXHAUSTED.
        ("grpc.server.max_pending_requests", max(10_000, 4 * cfg.max_queue_size)),
        ("grpc.server.max_pending_requests_hard_limit", max(20_000, 8 * cfg.max_queue_size)),
        # Hostile senders (docs/reliability.md, 6). Streams per connection are bounded (gRPC's
        # default is unlimited) above a burst the server's own queue sheds: streams refused before
        # the client reads the setting come back UNAVAILABLE instead of RESOURCE_EXHAUSTED.
        ("grpc.max_concurrent_streams", max(4096, 4 * cfg.max_queue_size)),
        # A sender that stops reading (no PING ack) loses its connection, and the memory its
        # half-sent messages hold, within keepalive time + timeout: ~30 s.
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # One that acks PINGs but never finishes a message is cut at the connection's age:
        # GOAWAY after MAX_CONNECTION_AGE_S (+-10 % jitter), then calls still open get the grace
        # period (--grace-s, as at shutdown), then the connection is closed. Clients reconnect on GOAWAY.
        ("grpc.max_connection_age_ms", int(1000 * max_connection_age_s())),
        ("grpc.max_connection_age_grace_ms", int(1000 * cfg.grace_s)),
    ]
    # A stream's message unfinished after --receive-timeout-s is answered DEADLINE_EXCEEDED and freed.
    server = grpc.aio.server(options=opts, interceptors=[ReceiveDeadline(cfg.receive_timeout_s)])
    add_inference_servicer(servicer, server)
    # The Open Inference Protocol beside netgain.v1, through the same servicer (server/oip.py).
    add_oip_servicer(OipServicer(servicer, io or oip_io(cfg)), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    addr = f"{cfg.host}:{cfg.port}"
    creds = credentials(cfg)
    port = server.add_secure_port(addr, creds) if creds else server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot bind {addr}: address in use or not available")
    await set_health(health_servicer, False)
    await server.start()
    return server, port


# After SIGTERM the gRPC server keeps taking calls, refusing them, until none has come for QUIET_S
# (at most SETTLE_MAX_S after the last answer, within --grace-s); only then does it stop.
QUIET_S = 0.25
SETTLE_MAX_S = 2.0


async def drain(
    server: grpc.aio.Server, servicer: InferenceServicer, health_servicer: Any, grace_s: float
) -> None:
    """Refuse new requests at once (UNAVAILABLE, retryable), turn health NOT_SERVING, and stop the
    gRPC server once the requests in flight are answered and new ones have stopped coming (or
    --grace-s has passed)."""
    # Refused from here on: the gRPC server itself stops accepting only once server.stop runs,
    # a few loop turns later, and a request slipping in between would be queued and served.
    servicer.stopping = True
    await set_health(health_servicer, False)
    clock = servicer.clock
    start = last_busy = clock()
    quiet_ns, cap_ns, grace_ns = int(QUIET_S * 1e9), int(SETTLE_MAX_S * 1e9), int(grace_s * 1e9)
    # Why not stop at once: gRPC's stop CANCELs calls it took but had not handed over (grpc/grpc#41785).
    while (now := clock()) - start < grace_ns:
        if servicer.in_flight:
            last_busy = now
        elif now - max(last_busy, servicer.refused_ns) >= quiet_ns or now - last_busy >= cap_ns:
            break
        await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(server.stop(max(0.0, grace_s - (clock() - start) / 1e9)))
    while servicer.in_flight and clock() - start < grace_ns:
        await asyncio.sleep(0.01)
    await stopping


def server_info(
    cfg: ServeConfig,
    model: str,
    device: str,
    lib_versions: dict[str, str],
    cold: ColdStart,
    *,
    ready: bool,
    intra_op_threads: int,
    metrics_port: int,
    workers: int = 0,
    slots_per_worker: int = 0,
    pre_processes: int = 0,
    cores: str = "",
) -> pb.ServerInfoResponse:
    """The ServerInfo answer, the same for the one-process server and a --workers server;
    ``cores``: every server process's cores, as ``describe_cores`` says them."""
    return pb.ServerInfoResponse(
        model=model,
        device=device,
        dtype=cfg.dtype,
        versions={
            **lib_versions,
            "event_loop": eventloop.describe(cfg.event_loop),
            **({"server_cores": cores} if cores else {}),
        },
        batching=pb.BatchingConfig(
            max_batch_size=cfg.max_batch_size,
            max_queue_delay_ms=cfg.max_queue_delay_ms,
            max_queue_size=cfg.max_queue_size,
            instances=cfg.instances,
            pre_threads=cfg.pre_threads,
            workers=workers,
            slots_per_worker=slots_per_worker,
            pre_processes=pre_processes,
        ),
        cold_start=[pb.ColdStartPhase(name=n, at_s=a, duration_s=d) for n, a, d in cold.timeline()],
        pid=os.getpid(),
        start_unix_s=cold.created_unix_s,
        ready=ready,
        intra_op_threads=intra_op_threads,
        host=socket.gethostname(),
        handler_options=cfg.handler_options,
        handler=cfg.model,
        metrics_port=metrics_port,
    )
