"""Start-up, serving and shutdown of ``netgain serve``."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import platform
import random
import signal
import socket
import sys
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from netgain.contract.cores import cpu_list
from netgain.protos import inference_pb2 as pb
from netgain.protos.service import SERVICE_NAME, add_inference_servicer, add_oip_servicer
from netgain.server.batching.pipeline import Batch, Pipeline, PipelineConfig
from netgain.server.batching.queue import RequestQueue
from netgain.server.coldstart import ColdStart
from netgain.server.config import ServeConfig
from netgain.server.device import DeviceRunner, resolve_device
from netgain.server.handlers import create_handler
from netgain.server.handlers.base import Handler
from netgain.server.oip import OipServicer, model_io
from netgain.server.service import MAX_METADATA_BYTES, InferenceServicer, Limits
from netgain.server.telemetry.metrics import ServerMetrics
from netgain.server.telemetry.otlp import build_tracing
from netgain.server.telemetry.recorder import Recorder, SpanLog
from netgain.server.telemetry.samplers import Sampler

log = logging.getLogger("netgain.server")


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


def warm_up(handler: Handler, runner: DeviceRunner, cfg: ServeConfig) -> None:
    """Run batches of example payloads so first requests do not pay for lazy initialisation
    (and, with CUDA graphs, so every power-of-two batch bucket is captured before serving)."""
    rng = random.Random(cfg.seed)
    sizes = {1, cfg.max_batch_size}
    if runner.cuda_graphs:
        sizes |= {min(2**k, cfg.max_batch_size) for k in range(cfg.max_batch_size.bit_length() + 1)}
    for _ in range(cfg.warmup_batches):
        for size in sorted(sizes):
            items = [handler.preprocess(handler.example_input(rng)) for _ in range(size)]
            runner.run(runner.prepare(handler.collate(items)))


class Server:
    def __init__(self, cfg: ServeConfig, cold: ColdStart) -> None:
        cfg.validate()
        self.cfg = cfg
        self.cold = cold
        self.device = resolve_device(cfg.device)
        self.handler = create_handler(cfg.model, cfg.handler_options, cfg.seed)
        self.registry = CollectorRegistry()
        self.metrics = ServerMetrics(self.registry, self.handler.name, self.device)
        self.requests = RequestQueue(cfg.max_queue_size)
        span_log = SpanLog(cfg.span_log, cfg.span_log_max_bytes) if cfg.span_log else None
        tracer, exporter = build_tracing(
            cfg.otlp_endpoint, self.metrics if cfg.instrumentation else None, self.handler.name, self.device
        )
        self.recorder = Recorder(
            self.metrics if cfg.instrumentation else None,
            span_log,
            cfg.recorder_interval_s,
            tracer=tracer,
            exporter=exporter,
        )
        self.runners = [
            DeviceRunner(self.handler, self.device, cfg.dtype, cfg.nvtx, cfg.cuda_graphs)
            for _ in range(cfg.instances)
        ]
        self.servicer = InferenceServicer(
            self.handler.name,
            self.requests,
            self.recorder if cfg.instrumentation or span_log or tracer else None,
            Limits(cfg.max_items_per_request, cfg.max_message_bytes),
            self.info,
            self.start_profile,
            instrumented=cfg.instrumentation,
        )
        self.pipeline = Pipeline(
            self.handler,
            self.runners,
            self.requests,
            PipelineConfig(cfg.max_batch_size, cfg.max_queue_delay_ms, cfg.pre_threads, cfg.instrumentation),
            self.servicer.deliver,
            self._on_batch,
        )
        gpu_index = None
        if self.device.startswith("cuda"):
            gpu_index = int(self.device.split(":")[1]) if ":" in self.device else 0
        self.sampler = Sampler(
            self.metrics,
            cfg.instances,
            gpu_index,
            cfg.sample_interval_s,
        )
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self.grpc_port = 0
        self.metrics_port = -1
        self._metrics_http: Any = None
        self._profiles = 0

    def _on_batch(self, batch: Batch, result: Any) -> None:
        size = batch.rows[-1][2] if batch.rows else 0
        self.recorder.batch_done(size, result.kernel_ns if result is not None else 0, batch.requests)

    # -- info and profiling ----------------------------------------------------------
    def info(self) -> pb.ServerInfoResponse:
        return server_info(
            self.cfg,
            self.handler.name,
            self.device,
            versions(),
            self.cold,
            ready=self.servicer.ready,
            intra_op_threads=self._intra_op_threads(),
            metrics_port=self.metrics_port,
        )

    def start_profile(self, batches: int, ranges_only: bool = False) -> Any:
        if not self.cfg.profile_dir:
            raise ValueError("profiling is off: start the server with --profile-dir DIR")
        os.makedirs(self.cfg.profile_dir, exist_ok=True)
        self._profiles += 1
        path = os.path.join(self.cfg.profile_dir, f"trace-{os.getpid()}-{self._profiles}.json")
        return self.pipeline.request_profile(batches, path, ranges_only)

    def _intra_op_threads(self) -> int:
        import torch

        return int(torch.get_num_threads())

    # -- lifecycle ---------------------------------------------------------------------
    async def _start_grpc(self) -> grpc.aio.Server:
        from netgain.server.ports import release_claims

        server, self.grpc_port = await start_grpc(self.cfg, self.servicer, self.health)
        release_claims()  # listening: the port check alone refuses the port to others now
        return server

    def _start_metrics(self) -> None:
        if self.cfg.metrics_port < 0:
            return
        httpd, _ = start_http_server(self.cfg.metrics_port, addr=self.cfg.host, registry=self.registry)
        self._metrics_http = httpd
        self.metrics_port = int(httpd.server_port)

    def _load(self) -> None:
        import torch

        cfg = self.cfg
        cores = len(os.sched_getaffinity(0))
        torch.set_num_threads(cfg.intra_op_threads or cores)
        if cfg.profile_dir:
            import torch.profiler  # now, not on the event loop at the first capture
        for runner in self.runners:
            model = self.handler.build_model()
            self.cold.mark("model_built")
            runner.place(model)
            self.cold.mark("on_device")
        for runner in self.runners:
            warm_up(self.handler, runner, cfg)
        self.cold.mark("warmup")

    def _publish_static_metrics(self) -> None:
        m, cfg = self.metrics, self.cfg
        for name, _, duration in self.cold.timeline():
            m.cold_start.labels(**m.labels, phase=name).set(duration)
        m.ready.labels(**m.labels).set(1)
        m.info.labels(**m.labels).info(
            {
                "dtype": cfg.dtype,
                "torch": versions()["torch"],
                "max_batch_size": str(cfg.max_batch_size),
                "instances": str(cfg.instances),
            }
        )
        m.queue_depth.labels(**m.labels).set_function(lambda: len(self.requests))
        m.in_flight.labels(**m.labels).set_function(lambda: self.servicer.in_flight)

    def _write_ports(self) -> None:
        line = f"netgain serve: grpc {self.cfg.host}:{self.grpc_port}"
        if self.metrics_port >= 0:
            line += f", metrics http://{self.cfg.host}:{self.metrics_port}/metrics"
        print(line, flush=True)
        if self.cfg.ports_file:
            tmp = self.cfg.ports_file + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"grpc": self.grpc_port, "metrics": self.metrics_port, "pid": os.getpid()}, fh)
            os.replace(tmp, self.cfg.ports_file)

    async def serve(self) -> int:
        self._start_metrics()
        self.metrics.ready.labels(**self.metrics.labels).set(0)
        server = await self._start_grpc()
        self._write_ports()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        load_task = asyncio.ensure_future(asyncio.to_thread(self._load))
        stop_task = asyncio.ensure_future(stop.wait())
        await asyncio.wait({load_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if not load_task.done():
            print("netgain serve: stopped during model load", file=sys.stderr, flush=True)
            await server.stop(0)
            return 0
        load_task.result()  # re-raise a load failure
        self.pipeline.start()
        self.recorder.start()
        self.sampler.start()
        self.cold.mark("ready")
        self._publish_static_metrics()
        self.servicer.ready = True
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        total = self.cold.timeline()[-1][1]
        print(
            f"netgain serve: ready ({self.handler.name} on {self.device}, cold start {total:.2f} s, "
            f"cores {cpu_list(sorted(os.sched_getaffinity(0)))})",
            flush=True,
        )
        await stop_task
        await self.shutdown(server)
        return 0

    async def shutdown(self, server: grpc.aio.Server) -> None:
        """Stop accepting, finish in-flight requests, flush the span log."""
        # Refused from here on: the gRPC server itself stops accepting only once server.stop runs,
        # a few loop turns later, and a request slipping in between would be queued and served.
        self.servicer.stopping = True
        print("netgain serve: draining", flush=True)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        started = time.monotonic()
        stopping = asyncio.ensure_future(server.stop(self.cfg.grace_s))
        while self.servicer.in_flight and time.monotonic() - started < self.cfg.grace_s:
            await asyncio.sleep(0.01)
        await stopping
        await asyncio.to_thread(self.pipeline.stop)
        self.sampler.stop()
        self.recorder.stop()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        print("netgain serve: stopped", flush=True)


def run_server(cfg: ServeConfig, cold: ColdStart) -> int:
    sys.setswitchinterval(cfg.switch_interval_ms / 1e3)
    device = resolve_device("auto") if cfg.device == "auto" else cfg.device
    workers = cfg.resolved_workers(len(os.sched_getaffinity(0)), device)
    if workers > 0:
        from netgain.server.multiproc.supervisor import run_multiprocess

        return run_multiprocess(cfg, cold)
    if isinstance(cfg.device_cores, int) and cfg.device_cores:
        raise ValueError(
            "--device-cores needs frontend processes (--workers 1 or more): this server runs one process"
        )
    if cfg.port:
        from netgain.server.ports import claim_port

        claim_port(cfg.host, cfg.port)
    server = Server(cfg, cold)
    return asyncio.run(server.serve())


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


async def start_grpc(cfg: ServeConfig, servicer: Any, health_servicer: Any) -> tuple[grpc.aio.Server, int]:
    """The gRPC server (inference, health NOT_SERVING, reflection) listening on cfg's address."""
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
    server = grpc.aio.server(options=opts)
    add_inference_servicer(servicer, server)
    # The Open Inference Protocol beside netgain.v1, through the same servicer (server/oip.py);
    # its tensors follow the handler's example payload (a throwaway instance: no model is built).
    add_oip_servicer(OipServicer(servicer, model_io(create_handler(cfg.model, cfg.handler_options))), server)
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
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    return server, port


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
) -> pb.ServerInfoResponse:
    """The ServerInfo answer, the same for the one-process server and a --workers server."""
    return pb.ServerInfoResponse(
        model=model,
        device=device,
        dtype=cfg.dtype,
        versions=lib_versions,
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
