"""Start-up, serving and shutdown of ``netgain serve``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

import grpc

from netgain.contract.cores import cpu_list, describe_cores
from netgain.protos import inference_pb2 as pb
from netgain.server import eventloop
from netgain.server.batching.pipeline import Batch, Pipeline, PipelineConfig
from netgain.server.batching.queue import RequestQueue
from netgain.server.bootstrap import (
    build_handler,
    build_runners,
    build_servicer,
    build_telemetry,
    drain,
    new_health,
    oip_io,
    publish_static,
    serve_metrics,
    server_info,
    set_health,
    start_grpc,
    versions,
    warm_up,
    write_ports,
)
from netgain.server.coldstart import ColdStart
from netgain.server.config import ServeConfig
from netgain.server.device import resolve_device

log = logging.getLogger("netgain.server")


class Server:
    def __init__(self, cfg: ServeConfig, cold: ColdStart) -> None:
        cfg.validate()
        self.cfg = cfg
        self.cold = cold
        self.cores = describe_cores(sorted(os.sched_getaffinity(0)))  # ServerInfo's, read once
        self.device = resolve_device(cfg.device)
        self.handler = build_handler(cfg)
        self.handler.check_device(self.device)
        self.telemetry = build_telemetry(cfg, self.handler.name, self.device, runs_model=True, span_log=True)
        self.registry, self.metrics = self.telemetry.registry, self.telemetry.metrics
        self.recorder, self.sampler = self.telemetry.recorder, self.telemetry.sampler
        self.requests = RequestQueue(cfg.max_queue_size)
        self.runners = build_runners(self.handler, self.device, cfg)
        self.servicer = build_servicer(
            cfg,
            self.handler.name,
            self.requests,
            self.telemetry,
            cfg.max_items_per_request,
            self.info,
            self.start_profile,
        )
        self.pipeline = Pipeline(
            self.handler,
            self.runners,
            self.requests,
            PipelineConfig(cfg.max_batch_size, cfg.max_queue_delay_ms, cfg.pre_threads, cfg.instrumentation),
            self.servicer.deliver,
            self._on_batch,
        )
        self.health = new_health()
        self.grpc_port = 0
        self.http: Any = None  # the REST endpoint (--http-port), an HttpServer once listening
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
            cores=self.cores,
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
    async def _listen(self) -> grpc.aio.Server:
        """gRPC, and the REST endpoint with --http-port, both on the one servicer."""
        from netgain.server.ports import release_claims

        io = oip_io(self.cfg)
        server, self.grpc_port = await start_grpc(self.cfg, self.servicer, self.health, io)
        if self.cfg.http_port >= 0:
            from netgain.server.rest.endpoint import start_http

            try:
                self.http = await start_http(self.cfg, self.servicer, io, reuse_port=False)
            except ValueError:
                await server.stop(0)
                raise
        release_claims()  # listening: the port check alone refuses the ports to others now
        return server

    def _start_metrics(self) -> None:
        if self.cfg.metrics_port < 0:
            return
        cfg = self.cfg
        self._metrics_http, self.metrics_port = serve_metrics(self.registry, cfg.metrics_port, cfg.host)

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
        m = self.metrics
        publish_static(m, self.cfg, self.cold, versions()["torch"])
        m.queue_depth.labels(**m.labels).set_function(lambda: len(self.requests))
        m.in_flight.labels(**m.labels).set_function(lambda: self.servicer.in_flight)

    async def serve(self) -> int:
        self._start_metrics()
        self.metrics.ready.labels(**self.metrics.labels).set(0)
        server = await self._listen()
        write_ports(self.cfg, self.grpc_port, self.metrics_port, self.http.port if self.http else -1)
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
            if self.http is not None:
                await self.http.close()
            return 0
        load_task.result()  # re-raise a load failure
        self.pipeline.start()
        self.telemetry.start()
        self.cold.mark("ready")
        self._publish_static_metrics()
        self.servicer.ready = True
        await set_health(self.health, True)
        total = self.cold.timeline()[-1][1]
        print(
            f"netgain serve: ready ({self.handler.name} on {self.device}, cold start {total:.2f} s, "
            f"{eventloop.loop_factory(self.cfg.event_loop)[0]} event loop, "
            f"cores {cpu_list(sorted(os.sched_getaffinity(0)))})",
            flush=True,
        )
        await stop_task
        await self.shutdown(server)
        return 0

    async def shutdown(self, server: grpc.aio.Server) -> None:
        """Stop accepting, finish in-flight requests, flush the span log."""
        print("netgain serve: draining", flush=True)
        await drain(server, self.servicer, self.health, self.cfg.grace_s)
        if self.http is not None:  # its requests were answered in the drain; new ones were refused
            await self.http.close()
        await asyncio.to_thread(self.pipeline.stop)
        self.telemetry.stop()
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
    if cfg.pin_pre_processes:
        raise ValueError(
            "--pin-pre-processes needs pre-processing processes (--workers 1 or more): "
            "this server runs one process"
        )
    from netgain.server.ports import claim_port

    if cfg.port:
        claim_port(cfg.host, cfg.port)
    if cfg.http_port > 0:  # one process's REST endpoint binds without SO_REUSEPORT: checked, not held
        claim_port(cfg.host, cfg.http_port, flag="--http-port", hold=False)
    server = Server(cfg, cold)
    return eventloop.run(server.serve(), cfg.event_loop)
