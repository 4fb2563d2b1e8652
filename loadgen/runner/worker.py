"""A load-generator worker: runs its shard of the schedule open-loop and streams records to the master.

Runs under gevent (Locust's worker). Each request goes out at its scheduled time in
its own greenlet, whether or not earlier ones returned; a cap on requests in flight
turns overflow into DROPPED rows, never into silent delay. Times are taken with
``perf_counter_ns`` and aligned once to the master's epoch.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import gevent
import grpc
import psutil

from loadgen.payloads import PayloadFactory
from loadgen.runner.protocol import DONE, GO, PHASE_COLUMNS, PLAN, READY, RECORDS, Plan, empty_columns
from protos.service import SERVICE_NAME
from server.timing import BATCH_KEY, PHASES, REQUEST_ID_KEY, TIMING_KEY, parse_batch, parse_server_timing

log = logging.getLogger("netgain.loadgen")
FLUSH_INTERVAL_S = 0.25
SPIN_NS = 2_000_000  # sleep coarsely until this close to the send time, then yield-spin


def parse_trailers(md: Any) -> dict[str, Any]:
    """Server phases, total and batch from trailing metadata; missing values are None."""
    out: dict[str, Any] = {c: None for c in PHASE_COLUMNS}
    out.update(server_total_ms=None, batch_id=None, batch_size=None)
    for key, value in md or ():
        if key == TIMING_KEY:
            try:
                timing = parse_server_timing(value)
            except ValueError:
                continue
            for phase in PHASES:
                if phase in timing:
                    out[f"{phase}_ms"] = timing[phase]
            out["server_total_ms"] = timing.get("total")
        elif key == BATCH_KEY:
            try:
                bid, bsize = parse_batch(value)
            except ValueError:
                continue
            out["batch_id"] = bid if bid >= 0 else None
            out["batch_size"] = bsize if bid >= 0 else None
    return out


class ShardRunner:
    def __init__(self, plan: Plan, send: Any) -> None:
        self.plan = plan
        self.send = send  # send(msg_type, data)
        self.cols = empty_columns()
        self.in_flight = 0
        self.proc = psutil.Process()
        self._cpu_mark = self._run_mark = self._main_thread_cpu()
        self.epoch_perf_ns = 0
        self.payloads = PayloadFactory(plan.model, plan.handler_options, plan.seed)
        creds = None
        if plan.tls_ca:
            with open(plan.tls_ca, "rb") as fh:
                creds = grpc.ssl_channel_credentials(fh.read())
        # Reconnect within ~0.5 s of a restarted server: gRPC's default backoff (1 s, x1.6, up to
        # 120 s) keeps failing requests long after the server is back, so the client's error window
        # would overstate the outage (tests/test_reliability_faults.py).
        opts = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        self.channels = [
            grpc.secure_channel(t, creds, opts) if creds else grpc.insecure_channel(t, opts)
            for t in plan.targets
        ]
        # Bytes in, bytes out: requests are pre-serialized and responses only measured.
        self.calls = [ch.unary_unary(f"/{SERVICE_NAME}/Infer", None, None) for ch in self.channels]
        self.index, self.t_ns, self.size, self.items = plan.arrays()
        self.bodies: list[bytes] = []
        self.sent = self.done = self.dropped = 0

    def prepare(self) -> None:
        self.bodies = [
            self.payloads.request_bytes(int(i), int(s), int(k))
            for i, s, k in zip(self.index, self.size, self.items, strict=True)
        ]

    def start(self, epoch_unix_ns: int) -> None:
        self.epoch_perf_ns = time.perf_counter_ns() + (epoch_unix_ns - time.time_ns())
        self._cpu_mark = self._run_mark = self._main_thread_cpu()
        flusher = gevent.spawn(self._flush_loop)
        try:
            if self.plan.mode == "closed":
                self._run_closed()
            else:
                self._run_open()
        finally:
            flusher.kill()
            self._flush()
            self.send(
                DONE,
                {
                    "worker": self.plan.worker,
                    "sent": self.sent,
                    "done": self.done,
                    "dropped": self.dropped,
                    "cpu_ratio": self._run_cpu_ratio(),
                },
            )

    # -- open loop ------------------------------------------------------------------
    def _run_open(self) -> None:
        pool: list[gevent.Greenlet] = []
        for j in range(len(self.index)):
            due = self.epoch_perf_ns + int(self.t_ns[j])
            while True:
                left = due - time.perf_counter_ns()
                if left <= 0:
                    break
                gevent.sleep((left - SPIN_NS / 2) / 1e9 if left > SPIN_NS else 0)
            if self.in_flight >= self.plan.max_in_flight:
                self.dropped += 1
                self._record(j, None, None, "DROPPED", 0, {})
                continue
            pool.append(gevent.spawn(self._fire, j, int(self.t_ns[j])))
            # Yield at once: a spawned greenlet only starts (and sends) when this loop yields, and
            # a worker behind schedule must still answer heartbeats and read responses.
            gevent.sleep(0)
            if len(pool) > 4096:
                pool = [g for g in pool if not g.dead]
        gevent.joinall(pool, timeout=self.plan.timeout_s + 5.0)

    # -- closed loop ----------------------------------------------------------------
    def _run_closed(self) -> None:
        plan = self.plan
        end = self.epoch_perf_ns + plan.duration_ns
        counter = iter(range(10**12))

        def loop(k: int) -> None:
            while time.perf_counter_ns() < end:
                seq = next(counter)
                j = seq % max(1, len(self.bodies))
                self._fire(
                    j, time.perf_counter_ns() - self.epoch_perf_ns, index=plan.worker + plan.workers * seq
                )
                if plan.think_ms:
                    gevent.sleep(plan.think_ms / 1e3)

        users = [gevent.spawn(loop, k) for k in range(plan.concurrency)]
        gevent.joinall(users, timeout=plan.duration_ns / 1e9 + plan.timeout_s + 5.0)

    # -- one request ------------------------------------------------------------------
    def _fire(self, j: int, scheduled_ns: int, index: int | None = None) -> None:
        body = self.bodies[j]
        idx = int(self.index[j]) if index is None else index
        target = idx % len(self.calls)
        rid = f"{self.plan.run_id}-{idx}"
        self.in_flight += 1
        sent = time.perf_counter_ns() - self.epoch_perf_ns
        try:
            raw, call = self.calls[target].with_call(
                body, metadata=((REQUEST_ID_KEY, rid),), timeout=self.plan.timeout_s
            )
            md: Any = call.trailing_metadata()
            status, resp_bytes = "OK", len(raw)
        except grpc.RpcError as exc:
            status, resp_bytes = exc.code().name, 0
            md = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else ()  # type: ignore[attr-defined]
        done = time.perf_counter_ns() - self.epoch_perf_ns
        self.in_flight -= 1
        self.sent += 1
        self.done += 1
        self._record(j, sent, done, status, resp_bytes, parse_trailers(md), scheduled_ns, idx, target)

    def _record(
        self,
        j: int,
        sent: int | None,
        done: int | None,
        status: str,
        resp_bytes: int,
        server: dict[str, Any],
        scheduled_ns: int | None = None,
        idx: int | None = None,
        target: int | None = None,
    ) -> None:
        c = self.cols
        idx = int(self.index[j]) if idx is None else idx
        sched = int(self.t_ns[j]) if scheduled_ns is None else scheduled_ns
        c["index"].append(idx)
        c["request_id"].append(f"{self.plan.run_id}-{idx}")
        c["worker"].append(self.plan.worker)
        c["target"].append(self.plan.targets[idx % len(self.plan.targets) if target is None else target])
        c["warmup"].append(sched < self.plan.warmup_ns)
        c["scheduled_ns"].append(sched)
        c["sent_ns"].append(sent)
        c["done_ns"].append(done)
        c["status"].append(status)
        c["items"].append(int(self.items[j]))
        c["request_bytes"].append(len(self.bodies[j]) if self.bodies else 0)
        c["response_bytes"].append(resp_bytes)
        for key in ("batch_id", "batch_size", *PHASE_COLUMNS, "server_total_ms"):
            c[key].append(server.get(key))

    def _main_thread_cpu(self) -> tuple[float, float]:
        """(monotonic time, CPU seconds of the main thread): the one gevent runs on, the thread
        that saturates first. gRPC's own core threads are not counted."""
        pid = self.proc.pid
        cpu = next((t.user_time + t.system_time for t in self.proc.threads() if t.id == pid), 0.0)
        return time.monotonic(), cpu

    def _cpu_ratio(self) -> float:
        """Main-thread CPU over wall time since the last call (1.0 = one core, saturated)."""
        now = self._main_thread_cpu()
        (t0, c0), self._cpu_mark = self._cpu_mark, now
        return (now[1] - c0) / max(1e-9, now[0] - t0)

    def _run_cpu_ratio(self) -> float:
        now = self._main_thread_cpu()
        t0, c0 = self._run_mark
        return (now[1] - c0) / max(1e-9, now[0] - t0)

    def _flush(self) -> None:
        if self.cols["index"]:
            cols, self.cols = self.cols, empty_columns()
            cols["_cpu_ratio"] = self._cpu_ratio()  # type: ignore[assignment]
            cols["_in_flight"] = self.in_flight  # type: ignore[assignment]
            self.send(RECORDS, cols)

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(FLUSH_INTERVAL_S)
            self._flush()


def run_worker(master_host: str, master_port: int) -> int:
    """Connect to a master, wait for a plan, run it, and exit when the master quits."""
    from locust.env import Environment

    env = Environment(user_classes=[], events=None)
    runner = env.create_worker_runner(master_host, master_port)
    state: dict[str, Any] = {}

    def send(msg_type: str, data: Any) -> None:
        runner.send_message(msg_type, data)

    def on_plan(environment: Any, msg: Any, **_: Any) -> None:
        def prepare() -> None:
            try:
                shard = ShardRunner(Plan.from_msg(msg.data), send)
                shard.prepare()
                state["shard"] = shard
                send(READY, {"worker": shard.plan.worker, "requests": len(shard.bodies), "pid": os.getpid()})
            except Exception as exc:  # tell the master instead of dying silently
                log.exception("worker failed to prepare")
                send(READY, {"worker": msg.data.get("worker", -1), "error": f"{type(exc).__name__}: {exc}"})

        gevent.spawn(prepare)

    def on_go(environment: Any, msg: Any, **_: Any) -> None:
        shard = state.get("shard")
        if shard is not None:
            gevent.spawn(shard.start, int(msg.data["epoch_unix_ns"]))

    runner.register_message(PLAN, on_plan)
    runner.register_message(GO, on_go)
    runner.greenlet.join()
    return 0
