"""The master of a load run: probes targets, starts workers, deals the schedule, watches, and
writes the run directory."""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import gevent
import grpc
from gevent import pywsgi
from prometheus_client import CollectorRegistry, start_http_server

from netgain.contract import rundir as files
from netgain.contract.messages import DONE, GO, HELLO, PLAN, READY, RECORDS, Plan
from netgain.contract.records import RECORD_COLUMNS, empty_columns
from netgain.errors import NetgainError
from netgain.loadgen.runner.live import ClientMetrics, LiveStats
from netgain.loadgen.runner.probe import probe_target
from netgain.loadgen.runner.scrape import Samples
from netgain.loadgen.runner.sink import RecordSink
from netgain.loadgen.runner.wire import decode_records
from netgain.loadgen.schedule import Schedule

EXIT_OK, EXIT_INVALID, EXIT_SLO = 0, 3, 4


@dataclass
class LoadConfig:
    targets: list[str]
    out: str
    workers: int = 1
    remote_workers: int = 0
    master_bind_host: str = "127.0.0.1"
    master_bind_port: int = 0
    mode: str = "open"
    concurrency: int = 0
    think_ms: float = 0.0
    warmup_s: float = 0.0
    duration_s: float = 10.0
    timeout_s: float = 10.0
    max_in_flight: int = 1000
    connections: int = 1
    seed: int = 0
    model: str | None = None
    metrics_port: int = -1
    web_ui: bool = False
    web_port: int = 8089
    max_send_lag_ms: float = 5.0
    max_worker_cpu: float = 0.9
    slo_p99_ms: float | None = None
    max_error_rate: float | None = None
    price_per_hour: float | None = None
    wait_ready_s: float = 0.0
    tls_ca: str | None = None
    probe: str = "all"  # "first": only the first target must be ready (scale-up drills)
    quiet: bool = False
    command: list[str] = field(default_factory=list)


class Master:
    def __init__(self, cfg: LoadConfig, schedule: Schedule) -> None:
        self.cfg = cfg
        self.schedule = schedule
        self.run_id = uuid.uuid4().hex[:8]
        self.workers_total = cfg.workers + cfg.remote_workers
        self.index_of: dict[str, int] = {}
        self.ready: dict[int, dict[str, Any]] = {}
        self.done: dict[int, dict[str, Any]] = {}
        self.lost: dict[int, float] = {}  # worker → seconds since epoch when lost
        self.hello: set[str] = set()  # Locust client ids of workers ready for a plan
        self.last_seen: dict[int, float] = {}  # worker → monotonic time of its last records
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env: Any = None  # Locust's Environment, once the run starts
        self.epoch_ns = 0
        # Ports actually bound (the flags may say 0: any free one); -1 when not served.
        self.metrics_port = -1
        self.web_port = -1
        registry = CollectorRegistry()
        self.client_metrics = (
            ClientMetrics(registry, cfg.slo_p99_ms, cfg.max_send_lag_ms) if cfg.metrics_port >= 0 else None
        )
        self.registry = registry
        self.live = LiveStats(
            self.client_metrics,
            out=open(os.devnull, "w") if cfg.quiet else sys.stderr,  # noqa: SIM115
            slo_p99_ms=cfg.slo_p99_ms,
            max_send_lag_ms=cfg.max_send_lag_ms,
        )
        os.makedirs(cfg.out, exist_ok=True)
        self.sink = RecordSink(os.path.join(cfg.out, files.REQUESTS), len(schedule))
        self.samples = Samples(os.path.join(cfg.out, files.SAMPLES))

    def log(self, message: str) -> None:
        if not self.cfg.quiet:
            print(f"netgain load: {message}", file=sys.stderr, flush=True)

    # -- message handlers (run in the master's receive greenlet) -------------------------
    def on_ready(self, environment: Any, msg: Any, **_: Any) -> None:
        self.ready[int(msg.data["worker"])] = msg.data

    def on_records(self, environment: Any, msg: Any, **_: Any) -> None:
        data = msg.data
        worker = int(data["worker"])
        cpu = data.get("_cpu_ratio")
        in_flight = data.get("_in_flight")
        batch = decode_records(data["ipc"])
        self.sink.add_batch(batch)
        self.live.add(batch)
        self.last_seen[worker] = time.monotonic()
        if in_flight is not None:
            self.live.in_flight[worker] = int(in_flight)
        if cpu is not None:
            self.live.worker_cpu[worker] = float(cpu)
            self.samples.add(self._now_s(), f"worker:{worker}", "netgain_client_worker_cpu_ratio", float(cpu))

    def on_hello(self, environment: Any, msg: Any, **_: Any) -> None:
        self.hello.add(msg.node_id)

    def on_done(self, environment: Any, msg: Any, **_: Any) -> None:
        self.done[int(msg.data["worker"])] = msg.data

    def _now_s(self) -> float:
        return (time.time_ns() - self.epoch_ns) / 1e9 if self.epoch_ns else 0.0

    # -- run ---------------------------------------------------------------------------------
    def run(self) -> int:
        from locust.env import Environment

        cfg = self.cfg
        probed = cfg.targets if cfg.probe == "all" else cfg.targets[:1]
        infos = [probe_target(t, cfg.wait_ready_s, cfg.tls_ca, say=self.log) for t in probed]
        model = cfg.model or infos[0].handler or infos[0].model
        env = Environment(user_classes=[], events=None)
        self.env = env
        runner = env.create_master_runner(cfg.master_bind_host, cfg.master_bind_port)
        handlers = (
            (HELLO, self.on_hello),
            (READY, self.on_ready),
            (RECORDS, self.on_records),
            (DONE, self.on_done),
        )
        for name, fn in handlers:
            runner.register_message(name, fn)
        web_ui: Any = None
        httpd: Any = None
        try:  # from here on, whatever fails, the master and its servers are stopped
            if cfg.web_ui:
                web_ui = self._start_web_ui(env)
                self.web_port = int(web_ui.server.server_port)
                self.log(f"web UI on http://{cfg.master_bind_host}:{self.web_port}/")
            if self.client_metrics is not None:
                try:
                    httpd, _ = start_http_server(
                        cfg.metrics_port, addr=cfg.master_bind_host, registry=self.registry
                    )
                except OSError as exc:
                    raise NetgainError(
                        _bind_error("--metrics-port", cfg.master_bind_host, cfg.metrics_port, exc)
                    ) from exc
                self.metrics_port = int(httpd.server_port)
                self.log(f"client metrics on http://{cfg.master_bind_host}:{self.metrics_port}/metrics")
            port = runner.server.port
            self.log(
                f"master on {cfg.master_bind_host}:{port}; starting {cfg.workers} local worker(s)"
                + (f", expecting {cfg.remote_workers} remote" if cfg.remote_workers else "")
            )
            self.master_port = port
            for _ in range(cfg.workers):
                self.procs.append(self._spawn_worker())
            self._await_workers(runner)
            self._deal(runner, model, infos[0])
            self._watch(runner, infos)
        finally:
            runner.quit()
            if web_ui is not None:
                web_ui.stop()
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
            for p in self.procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        return self._finish(infos, model)

    def _start_web_ui(self, env: Any) -> Any:
        """Start Locust's web UI (bound here, so a taken port fails at once) and return it."""
        with _locust_argv():
            web_ui = env.create_web_ui(self.cfg.master_bind_host, self.cfg.web_port, delayed_start=True)
        build = web_ui.update_template_args

        def update_template_args() -> None:  # runs again on every GET /
            with _locust_argv():
                build()

        web_ui.update_template_args = update_template_args
        # Locust's own start() binds inside a greenlet, where a taken port is only a logged
        # traceback; bound here, it fails the run in one line and port 0 can be reported.
        server = pywsgi.WSGIServer(
            (self.cfg.master_bind_host, self.cfg.web_port),
            web_ui.app,
            log=None,
            error_log=logging.getLogger("locust.web"),
        )
        try:
            server.init_socket()
        except OSError as exc:
            raise NetgainError(
                _bind_error("--web-ui", self.cfg.master_bind_host, self.cfg.web_port, exc)
            ) from exc
        web_ui.server = server
        web_ui.greenlet = gevent.spawn(server.serve_forever)
        return web_ui

    def _spawn_worker(self) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "netgain.loadgen.runner",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(self.master_port),
        ]
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def _await_workers(self, runner: Any) -> None:
        deadline = time.monotonic() + 60.0
        respawns = 0

        def greeted() -> list[str]:
            return sorted(cid for cid in runner.clients if cid in self.hello)

        while len(greeted()) < self.workers_total:
            if time.monotonic() > deadline:
                raise NetgainError(
                    f"only {len(greeted())} of {self.workers_total} workers connected within 60 s"
                )
            for k, p in enumerate(self.procs):
                if p.poll() is None:
                    continue
                # Nothing was sent yet, so a worker that died starting (seen on overloaded hosts:
                # a thread that could not be created) is simply started again, twice at most.
                if respawns >= 2:
                    raise NetgainError("a local worker exited during start-up; run with --debug to see why")
                respawns += 1
                self.log(f"a local worker exited during start-up (status {p.returncode}); starting another")
                self.procs[k] = self._spawn_worker()
            gevent.sleep(0.1)
        for i, cid in enumerate(greeted()[: self.workers_total]):
            self.index_of[cid] = i

    def _deal(self, runner: Any, model: str, info: Any) -> None:
        cfg = self.cfg
        per_worker_conc = [
            cfg.concurrency // self.workers_total + (1 if i < cfg.concurrency % self.workers_total else 0)
            for i in range(self.workers_total)
        ]
        for cid, i in self.index_of.items():
            shard = self.schedule.shard(i, self.workers_total)
            plan = Plan(
                run_id=self.run_id,
                worker=i,
                workers=self.workers_total,
                targets=cfg.targets,
                model=model,
                handler_options=dict(info.handler_options),
                seed=cfg.seed,
                mode=cfg.mode,
                warmup_ns=self.schedule.warmup_ns,
                timeout_s=cfg.timeout_s,
                max_in_flight=cfg.max_in_flight,
                connections=cfg.connections,
                index=shard.index.tobytes(),
                t_ns=shard.t_ns.tobytes(),
                size=shard.size.tobytes(),
                items=shard.items.tobytes(),
                concurrency=per_worker_conc[i],
                think_ms=cfg.think_ms,
                duration_ns=int((cfg.warmup_s + cfg.duration_s) * 1e9),
                tls_ca=cfg.tls_ca,
            )
            runner.send_message(PLAN, plan.to_msg(), client_id=cid)
        deadline = time.monotonic() + 300.0
        while len(self.ready) < self.workers_total:
            if time.monotonic() > deadline:
                raise NetgainError("workers did not finish building payloads within 300 s")
            gevent.sleep(0.05)
        errors = [r["error"] for r in self.ready.values() if "error" in r]
        if errors:
            raise NetgainError(f"a worker could not prepare its requests: {errors[0]}")
        self.epoch_ns = time.time_ns() + 500_000_000
        self.start_unix_s = self.epoch_ns / 1e9
        runner.send_message(GO, {"epoch_unix_ns": self.epoch_ns})
        mode = f"closed loop, concurrency {cfg.concurrency}" if cfg.mode == "closed" else "open loop"
        self.log(
            f"run {self.run_id}: {len(self.schedule)} requests scheduled over "
            f"{cfg.warmup_s + cfg.duration_s:.0f} s ({mode}), {self.workers_total} worker(s)"
        )

    def _watch(self, runner: Any, infos: list[Any]) -> None:
        cfg = self.cfg
        total_s = cfg.warmup_s + cfg.duration_s
        hard_stop = time.monotonic() + total_s + cfg.timeout_s + 60.0
        rate = len(self.schedule) / max(total_s, 1e-9) if cfg.mode == "open" else 0.0
        urls = [
            (f"http://{t.rsplit(':', 1)[0]}:{info.metrics_port}/metrics", f"server:{t}")
            for t, info in zip(cfg.targets, infos, strict=False)  # unprobed targets are not scraped
            if info.metrics_port > 0
        ]
        last_tick = time.monotonic()
        while len(self.done) + len(self.lost) < self.workers_total:
            gevent.sleep(0.25)
            now = time.monotonic()
            self._check_lost(runner)
            if now - last_tick >= 1.0:
                t_s = self._now_s()
                for url, source in urls:
                    self.samples.scrape(url, t_s, source)
                if self.client_metrics is not None:
                    self.client_metrics.workers.set(len(runner.clients) - len(self.lost))
                self.live.tick(min(t_s, total_s), total_s, rate, now - last_tick)
                last_tick = now
            if now > hard_stop:
                for i in self.index_of.values():
                    if i not in self.done and i not in self.lost:
                        self.lost[i] = self._now_s()
                self.log("workers did not finish in time; marking them lost")
        self.end_unix_s = time.time()

    def _check_lost(self, runner: Any) -> None:
        for cid, i in self.index_of.items():
            if i in self.done or i in self.lost:
                continue
            client = runner.clients.get(cid)
            pid = self.ready.get(i, {}).get("pid")
            dead_local = any(p.pid == pid and p.poll() is not None for p in self.procs)
            # Heartbeats can lag on a worker that is far behind schedule; records still arriving
            # prove it alive, so "missing" alone needs 10 s of silence too.
            silent = time.monotonic() - self.last_seen.get(i, 0.0) > 10.0
            missing = client is None or (client.state == "missing" and silent)
            if missing or dead_local:
                self.lost[i] = self._now_s()
                self.log(f"worker {i} lost at {self.lost[i]:.1f} s; keeping what it sent, the run is partial")

    # -- results ----------------------------------------------------------------------------
    def _fill_missing(self) -> dict[str, list[Any]]:
        fill = empty_columns()
        sched = self.schedule
        for idx in self.sink.missing():
            worker = int(idx % self.workers_total)
            lost_at = self.lost.get(worker)
            t_ns = int(sched.t_ns[idx])
            status = "WORKER_LOST" if lost_at is not None and t_ns <= lost_at * 1e9 else "NOT_SENT"
            row: dict[str, Any] = {c: None for c in RECORD_COLUMNS}
            row.update(
                index=int(idx),
                request_id=f"{self.run_id}-{idx}",
                worker=worker,
                target=self.cfg.targets[int(idx) % len(self.cfg.targets)],
                warmup=t_ns < sched.warmup_ns,
                scheduled_ns=t_ns,
                status=status,
                items=int(sched.items[idx]),
                request_bytes=0,
                response_bytes=0,
            )
            for c in RECORD_COLUMNS:
                fill[c].append(row[c])
        return fill

    def _write_locust_csv(self) -> None:
        """Locust's own statistics (fed by the workers' request events), as its --csv would write
        them: the familiar view, millisecond-rounded; requests.parquet is the exact record."""
        import csv

        if self.env is None:
            return
        from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

        writer = StatsCSV(self.env, PERCENTILES_TO_REPORT)
        for name, write in (
            (files.LOCUST_STATS, writer.requests_csv),
            (files.LOCUST_FAILURES, writer.failures_csv),
        ):
            with open(os.path.join(self.cfg.out, name), "w", newline="") as fh:
                write(csv.writer(fh))

    def _finish(self, infos: list[Any], model: str) -> int:
        cfg = self.cfg
        fill = self._fill_missing() if cfg.mode == "open" else empty_columns()
        self.sink.close(fill)
        self.samples.close()
        self._write_locust_csv()
        counts = {
            "scheduled": len(self.schedule) if cfg.mode == "open" else self.sink.written,
            "sent": self.live.sent,
            "answered": self.live.sent,
            "ok": self.live.ok,
            "errors": self.live.errors,
            "dropped": self.live.dropped,
            "not_sent": sum(1 for s in fill["status"] if s == "NOT_SENT"),
            "worker_lost": sum(1 for s in fill["status"] if s == "WORKER_LOST"),
            "rows": self.sink.written,
        }
        reasons = self._validity(counts)
        meta = build_meta(cfg, self, infos, model, counts, reasons)
        files.write_meta(cfg.out, meta)
        # Read from the histogram: at most 1 % high, on the SLO's side of it (the check is exact).
        p50, p99 = self.live.latency_ms(0.5), self.live.latency_ms(0.99)
        verdict = "VALID" if not reasons else "INVALID: " + "; ".join(reasons)
        print(
            f"netgain load: {counts['rows']} rows in {cfg.out}/{files.REQUESTS} | ok {counts['ok']} "
            f"errors {counts['errors']} dropped {counts['dropped']} | p50 {p50:.2f} ms p99 {p99:.2f} ms | "
            f"{verdict}",
            flush=True,
        )
        if reasons:
            return EXIT_INVALID
        # Exact, as the report's slo_held on the same rows.
        slo_fail = self.live.slo_failures(cfg.max_error_rate)
        if slo_fail:
            print("netgain load: SLO FAILED: " + "; ".join(slo_fail), flush=True)
            return EXIT_SLO
        return EXIT_OK

    def _validity(self, counts: dict[str, int]) -> list[str]:
        cfg = self.cfg
        reasons = []
        # Decided exactly as the report's validity check; the figure shown is the histogram's.
        if cfg.mode == "open" and self.live.send_lag_exceeded():
            reasons.append(
                f"send-lag p99 {self.live.lag_ms(0.99):.2f} ms > {cfg.max_send_lag_ms} ms: "
                "the generator fell behind"
            )
        if counts["dropped"]:
            reasons.append(f"{counts['dropped']} requests dropped at the in-flight cap ({cfg.max_in_flight})")
        if self.lost:
            reasons.append(f"worker(s) {sorted(self.lost)} lost: the run is partial")
        if counts["not_sent"]:
            reasons.append(f"{counts['not_sent']} scheduled requests were never sent")
        busy = {w: c for w, c in self.done_cpu().items() if c >= cfg.max_worker_cpu}
        if busy:
            reasons.append(f"worker CPU saturated ({', '.join(f'{w}: {c:.0%}' for w, c in busy.items())})")
        if counts["ok"] == 0 and counts["rows"]:
            reasons.append("no request succeeded")
        return reasons

    def done_cpu(self) -> dict[int, float]:
        return {w: float(d.get("cpu_ratio", 0.0)) for w, d in self.done.items()}


def _bind_error(flag: str, host: str, port: int, exc: OSError) -> str:
    """``--metrics-port: cannot serve on 127.0.0.1:9465: Address already in use``."""
    return f"{flag}: cannot serve on {host}:{port}: {exc.strerror or exc}"


@contextmanager
def _locust_argv() -> Iterator[None]:
    """Locust's web UI parses ``sys.argv`` as Locust's own flags whenever it builds its page (to
    list a locustfile's custom options); ours made it exit 2. It is shown no flags instead."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def build_meta(
    cfg: LoadConfig, master: Master, infos: list[Any], model: str, counts: dict[str, int], reasons: list[str]
) -> dict[str, Any]:
    import locust
    from google.protobuf.json_format import MessageToDict

    server = MessageToDict(infos[0], preserving_proto_field_name=True) if infos else {}
    config = asdict(cfg)
    config.pop("command", None)
    config.update(
        rate=len(master.schedule) / max(1e-9, cfg.warmup_s + cfg.duration_s),
        model=model,
        arrival=master.schedule.source,
        # The ports bound (-1: not served), so a port given as 0 can be found; the flags as given too.
        metrics_port=master.metrics_port,
        metrics_port_requested=cfg.metrics_port,
        web_port=master.web_port,
        web_port_requested=cfg.web_port,
    )
    return {
        "schema": files.SCHEMA_VERSION,
        "run_id": master.run_id,
        "command": cfg.command,
        "config": config,
        "versions": {
            "client": {
                "python": platform.python_version(),
                "grpc": grpc.__version__,
                "locust": getattr(locust, "__version__", ""),
                "netgain": _netgain_version(),
            },
            "server": server.get("versions", {}),
        },
        "host": {"client": socket.gethostname(), "server": server.get("host", "")},
        "server": server,
        "targets": [MessageToDict(i, preserving_proto_field_name=True) for i in infos[1:]],
        "trace": {
            "digest": master.schedule.digest,
            "source": master.schedule.source,
            "requests": len(master.schedule),
            "duration_s": master.schedule.duration_s,
            "mean_rate": len(master.schedule) / max(1e-9, master.schedule.duration_s),
        },
        "epoch_unix_ns": master.epoch_ns,
        "start_unix_s": master.epoch_ns / 1e9,
        "end_unix_s": getattr(master, "end_unix_s", time.time()),
        "workers": {
            "expected": master.workers_total,
            "lost": sorted(master.lost),
            "cpu_ratio": master.done_cpu(),
        },
        "counts": counts,
        "validity": {"valid": not reasons, "reasons": reasons},
    }


def _netgain_version() -> str:
    try:
        from importlib.metadata import version

        return version("netgain")
    except Exception:
        return ""
