"""The master of a load run: probes targets, starts workers, deals the schedule, watches, and
writes the run directory.

The jobs live beside it: ``config`` (LoadConfig), ``worker_pool`` (start, greet, lose), ``plans`` (the
schedule dealt), ``sink`` (records to Parquet), ``live`` (progress lines, client metrics),
``endpoints`` (web UI, /metrics), ``probe``, ``scrape``, ``hoststat`` (the host's CPU), ``results``
(verdict, exit status) and ``meta`` (meta.json)."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from typing import Any

import gevent
from prometheus_client import CollectorRegistry

from netgain.contract import rundir as files
from netgain.contract.messages import CHUNK, DONE, GO, HELLO, PLAN, READY, RECORDS, STOP
from netgain.loadgen.runner import endpoints, results
from netgain.loadgen.runner.config import LoadConfig
from netgain.loadgen.runner.hoststat import HostSampler
from netgain.loadgen.runner.http_probe import probe_json_target, probe_oip_http_target
from netgain.loadgen.runner.live import ClientMetrics, LiveStats
from netgain.loadgen.runner.meta import build_meta
from netgain.loadgen.runner.plans import SEND_AHEAD_S, Dealer, first_plans, shard_arrays
from netgain.loadgen.runner.probe import probe_oip_target, probe_target
from netgain.loadgen.runner.results import EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, EXIT_SLO
from netgain.loadgen.runner.scrape import Samples
from netgain.loadgen.runner.sink import RecordSink
from netgain.loadgen.runner.wire import decode_records
from netgain.loadgen.runner.worker_pool import Interrupted, WorkerPool
from netgain.loadgen.stream import StreamedSchedule

__all__ = ["EXIT_INTERRUPTED", "EXIT_INVALID", "EXIT_OK", "EXIT_SLO", "LoadConfig", "Master", "build_meta"]


DRAIN_S = 2.0  # after a Ctrl-C, requests in flight get this long (at most --timeout-s) to answer


class Master:
    sink: RecordSink  # opened once the probe has passed: a failed probe leaves no run behind

    def __init__(self, cfg: LoadConfig, schedule: StreamedSchedule) -> None:
        self.cfg = cfg
        self.schedule = schedule
        self.run_id = uuid.uuid4().hex[:8]
        self.workers = WorkerPool(cfg.workers, cfg.remote_workers, say=self.log)
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
        self.dealer = Dealer(schedule, self.workers.total)
        self.samples = Samples(os.path.join(cfg.out, files.SAMPLES))
        self.host = HostSampler()
        self.interrupted_at: float | None = None  # seconds since the epoch of the first Ctrl-C
        self._stop_sent = False

    def log(self, message: str) -> None:
        if not self.cfg.quiet:
            print(f"netgain load: {message}", file=sys.stderr, flush=True)

    def on_records(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker's records (run in the master's receive greenlet): to the sink and the live view."""
        data = msg.data
        worker = int(data["worker"])
        cpu = data.get("_cpu_ratio")
        in_flight = data.get("_in_flight")
        batch = decode_records(data["ipc"])
        self.sink.add_batch(batch)
        if self.cfg.mode == "open":
            self.dealer.mark(batch.column("index").to_numpy(zero_copy_only=False))
        self.live.add(batch)
        self.workers.seen(worker)
        if in_flight is not None:
            self.live.in_flight[worker] = int(in_flight)
        if cpu is not None:
            self.live.worker_cpu[worker] = float(cpu)
            self.samples.add(self._now_s(), f"worker:{worker}", "netgain_client_worker_cpu_ratio", float(cpu))

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """The first Ctrl-C stops the run in order (every row and meta.json are written); a
        second one aborts."""
        if self.interrupted_at is not None:
            raise KeyboardInterrupt
        self.interrupted_at = max(0.0, self._now_s())
        self.workers.interrupted = True

    def _now_s(self) -> float:
        return (time.time_ns() - self.epoch_ns) / 1e9 if self.epoch_ns else 0.0

    # -- run ---------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        probed = cfg.targets if cfg.probe == "all" else cfg.targets[:1]
        infos = [self._probe(t) for t in probed]
        os.makedirs(cfg.out, exist_ok=True)
        # Which requests have rows is the dealer's to know, over the window it deals.
        self.sink = RecordSink(os.path.join(cfg.out, files.REQUESTS), None)
        model = cfg.model or infos[0].handler or infos[0].model
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            return self._run(infos, model)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _probe(self, target: str) -> Any:
        """The target's ServerInfo (or what stands for it), once it is ready."""
        cfg = self.cfg
        if cfg.protocol == "oip":
            return probe_oip_target(
                target, cfg.oip_model or "", cfg.model or "", cfg.wait_ready_s, cfg.tls_ca, self.log
            )
        wait = (cfg.wait_ready_s, cfg.tls_ca, self.log, cfg.refused_grace_s)
        if cfg.protocol == "oip-http":
            return probe_oip_http_target(target, cfg.oip_model or "", cfg.model or "", *wait)
        if cfg.protocol == "http-json":
            return probe_json_target(target, cfg.request_template or {}, cfg.model or "", *wait)
        return probe_target(target, *wait[:3], refused_grace_s=cfg.refused_grace_s)

    def _run(self, infos: list[Any], model: str) -> int:
        from locust.env import Environment

        cfg = self.cfg
        env = Environment(user_classes=[], events=None)
        self.env = env
        runner = env.create_master_runner(cfg.master_bind_host, cfg.master_bind_port)
        handlers = (
            (HELLO, self.workers.on_hello),
            (READY, self.workers.on_ready),
            (RECORDS, self.on_records),
            (DONE, self.workers.on_done),
        )
        for name, fn in handlers:
            runner.register_message(name, fn)
        web_ui: Any = None
        httpd: Any = None
        try:  # from here on, whatever fails, the master and its servers are stopped
            if cfg.web_ui:
                web_ui = endpoints.start_web_ui(env, cfg.master_bind_host, cfg.web_port)
                self.web_port = int(web_ui.server.server_port)
                self.log(f"web UI on http://{cfg.master_bind_host}:{self.web_port}/")
            if self.client_metrics is not None:
                httpd = endpoints.start_metrics(self.registry, cfg.master_bind_host, cfg.metrics_port)
                self.metrics_port = int(httpd.server_port)
                self.log(f"client metrics on http://{cfg.master_bind_host}:{self.metrics_port}/metrics")
            port = runner.server.port
            self.log(
                f"master on {cfg.master_bind_host}:{port}; starting {cfg.workers} local worker(s)"
                + (f", expecting {cfg.remote_workers} remote" if cfg.remote_workers else "")
            )
            self.master_port = port
            self.workers.start_local(port)
            self.workers.await_connected(runner)
            self._deal(runner, model, infos[0])
            self._watch(runner, infos)
        except Interrupted:  # before the run began: nothing was sent, every row is NOT_SENT
            self.log("interrupted before the run began; writing the run directory")
        finally:
            runner.quit()
            if web_ui is not None:
                web_ui.stop()
            if httpd is not None:
                endpoints.stop_metrics(httpd)
            self.workers.reap()
        return self._finish(infos, model)

    def _deal(self, runner: Any, model: str, info: Any) -> None:
        """Send each worker its plan, wait until all are ready, then GO with a common epoch."""
        cfg, workers = self.cfg, self.workers
        first = self.dealer.take(int(SEND_AHEAD_S * 1e9), at_least_one=True)
        if cfg.mode == "closed":  # payloads only: requests are sent as answers come back
            self.dealer = Dealer(self.schedule, workers.total)
        more = cfg.mode == "open" and self.dealer.more
        for cid, plan in first_plans(
            cfg,
            first,
            more,
            self.schedule.warmup_ns,
            workers.index_of,
            workers.total,
            run_id=self.run_id,
            model=model,
            info=info,
        ):
            runner.send_message(PLAN, plan.to_msg(), client_id=cid)
        workers.await_ready()
        self.epoch_ns = time.time_ns() + 500_000_000
        self.start_unix_s = self.epoch_ns / 1e9
        runner.send_message(GO, {"epoch_unix_ns": self.epoch_ns})
        mode = f"closed loop, concurrency {cfg.concurrency}" if cfg.mode == "closed" else "open loop"
        self.log(
            f"run {self.run_id}: {len(self.schedule)} requests scheduled over "
            f"{cfg.warmup_s + cfg.duration_s:.0f} s ({mode}), {workers.total} worker(s)"
        )

    def _deal_more(self, runner: Any) -> None:
        """Deal the chunks due within SEND_AHEAD_S to the workers not lost; drop the dealt chunks
        whose rows are all in (writing rows for a lost worker's requests)."""
        if self.interrupted_at is not None:  # nothing more is dealt; rows still come in
            chunks = []
        else:
            chunks = self.dealer.take(int((self._now_s() + SEND_AHEAD_S) * 1e9))
        if chunks:
            more = self.dealer.more
            for cid, i in self.workers.index_of.items():
                if i not in self.workers.lost:
                    runner.send_message(
                        CHUNK, {**shard_arrays(chunks, i, self.workers.total), "more": more}, client_id=cid
                    )
        for fill in self.dealer.retire(self.workers.lost, run_id=self.run_id, targets=self.cfg.targets):
            self.sink.add_rows(fill)

    def _watch(self, runner: Any, infos: list[Any]) -> None:
        """Until every worker is done or lost: check for lost ones, and once a second scrape the
        servers and print progress."""
        cfg = self.cfg
        total_s = cfg.warmup_s + cfg.duration_s
        hard_stop = time.monotonic() + total_s + cfg.timeout_s + 60.0
        rate = len(self.schedule) / max(total_s, 1e-9) if cfg.mode == "open" else 0.0
        # A dns: target is a name for several pods (round_robin): one URL would reach a different
        # pod per lookup and mix their counters into one series, so it is not scraped.
        urls = [
            (f"http://{t.rsplit(':', 1)[0]}:{info.metrics_port}/metrics", f"server:{t}")
            for t, info in zip(cfg.targets, infos, strict=False)  # unprobed targets are not scraped
            if info.metrics_port > 0 and not t.startswith("dns:")
        ]
        for t in cfg.targets:
            if t.startswith("dns:"):
                self.log(f"{t}: several pods behind one name; /metrics not scraped (use Prometheus)")
        last_tick = time.monotonic()
        while not self.workers.finished():
            gevent.sleep(0.25)
            now = time.monotonic()
            if self.interrupted_at is not None and not self._stop_sent:
                self._stop_sent = True
                grace = min(DRAIN_S, cfg.timeout_s)
                self.log(
                    f"interrupted at {self.interrupted_at:.1f} s: no more requests are sent; those in "
                    f"flight get {grace:g} s, then are cancelled (Ctrl-C again to abort without writing)"
                )
                runner.send_message(STOP, {"grace_s": grace})
                hard_stop = min(hard_stop, now + grace + 15.0)
            self.workers.check_lost(runner, self._now_s())
            if cfg.mode == "open":
                self._deal_more(runner)
            if now - last_tick >= 1.0:
                t_s = self._now_s()
                for url, source in urls:
                    self.samples.scrape(url, t_s, source)
                for metric, labels, value in self.host.read():
                    self.samples.add(t_s, "host", metric, value, labels)
                if self.client_metrics is not None:
                    self.client_metrics.workers.set(self.workers.connected(runner))
                self.live.tick(min(t_s, total_s), total_s, rate, now - last_tick)
                last_tick = now
            if now > hard_stop:
                self.workers.lose_unfinished(self._now_s())
                self.log("workers did not finish in time; marking them lost")
        self.end_unix_s = time.time()

    # -- results ----------------------------------------------------------------------------
    def _finish(self, infos: list[Any], model: str) -> int:
        cfg, workers = self.cfg, self.workers
        if cfg.mode == "open":
            for fill in self.dealer.retire(workers.lost, run_id=self.run_id, targets=cfg.targets, final=True):
                self.sink.add_rows(fill)
        self.sink.close()
        self.samples.close()
        results.write_locust_csv(self.env, cfg.out)
        scheduled = len(self.schedule) if cfg.mode == "open" else self.sink.written
        d = self.dealer
        counts = results.count(scheduled, self.live, d.not_sent, d.worker_lost, self.sink.written)
        reasons = results.invalid_reasons(cfg, self.live, counts, workers.lost, workers.cpu())
        if self.interrupted_at is not None:
            reasons.insert(0, results.interrupted_reason(self.interrupted_at, cfg.warmup_s + cfg.duration_s))
        files.write_meta(cfg.out, build_meta(cfg, self, infos, model, counts, reasons))
        return results.verdict(cfg, self.live, counts, reasons, interrupted=self.interrupted_at is not None)
