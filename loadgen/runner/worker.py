"""A load-generator worker: a Locust worker (gevent) that relays for its sender engine.

The Locust side talks to the master (plan, epoch, records, done) over Locust's own messaging;
the sending happens in a child process (``loadgen.runner.engine``: asyncio with grpc.aio or an
HTTP/1.1 client, no gevent) that this worker starts per plan and feeds over a pipe pair. Each batch of records
also fires Locust's request events, so Locust's statistics (web UI, CSV) see every request.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import gevent
from gevent import subprocess

from netgain.contract.messages import CHUNK, DONE, GO, HELLO, PLAN, READY, RECORDS, STOP, SURPLUS
from netgain.loadgen.runner import frames
from netgain.loadgen.runner.wire import encode_records

log = logging.getLogger("netgain.loadgen")
SURPLUS_EXIT = 3  # the master has every worker it expects: this one was not used
# Set by the master on the workers it starts: a Ctrl-C reaches the whole process group, and the
# master alone decides how the run stops (it tells the workers with STOP).
LOCAL_WORKER_ENV = "NETGAIN_LOAD_LOCAL_WORKER"


def request_name(plan: dict[str, Any]) -> tuple[str, str]:
    """(request type, name) of a plan's requests in Locust's statistics: ``grpc Infer``, or for
    HTTP the method and path (``http POST /v2/models/m/infer``)."""
    http = plan.get("http") or {}
    protocol = plan.get("protocol", "netgain")
    if protocol == "oip-http":
        model = (plan.get("handler_options") or {}).get("oip.model", "")
        return "http", f"POST /v2/models/{model}/infer"
    if protocol == "http-json":
        return "http", f"{http.get('method', 'POST')} {http.get('path', '')}"
    return "grpc", "Infer"


def fire_request_events(
    events: Any, cols: dict[str, Any], request_type: str = "grpc", name: str = "Infer"
) -> None:
    """Locust's request event per record: latency from the intended send time, in ms; anything
    but OK is a failure named by its status (DROPPED ones included)."""
    fire = events.request.fire
    for sched, done, status, size in zip(
        cols["scheduled_ns"], cols["done_ns"], cols["status"], cols["response_bytes"], strict=True
    ):
        fire(
            request_type=request_type,
            name=name,
            response_time=(done - sched) / 1e6 if done is not None else 0.0,
            response_length=size or 0,
            exception=None if status == "OK" else RuntimeError(status),
            context={},
        )


class EngineLink:
    """One sender engine process and the greenlet that relays its frames to the master."""

    def __init__(self, plan: dict[str, Any], send: Any, runner: Any) -> None:
        self.worker = int(plan.get("worker", -1))
        self.request_type, self.name = request_name(plan)
        self.send = send
        self.runner = runner
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "netgain.loadgen.runner.engine"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        frames.write_frame(self.stdin, frames.PLAN, plan)
        self.started = False
        self.reader = gevent.spawn(self._relay)

    def go(self, epoch_unix_ns: int) -> None:
        self.started = True
        frames.write_frame(self.stdin, frames.GO, {"epoch_unix_ns": epoch_unix_ns})

    def chunk(self, data: dict[str, Any]) -> None:
        """The next part of the shard (open loop), straight on to the engine."""
        frames.write_frame(self.stdin, frames.CHUNK, data)

    def stop(self, grace_s: float) -> None:
        """Interrupted: the engine sends no more and drains its requests in flight."""
        if self.started and self.proc.poll() is None:
            frames.write_frame(self.stdin, frames.STOP, {"grace_s": grace_s})

    def _relay(self) -> None:
        while True:
            frame = frames.read_frame(self.stdout)
            if frame is None:
                break
            kind, data = frame
            if kind == frames.READY:
                self.send(READY, {**data, "worker": self.worker, "pid": os.getpid()})
            elif kind == frames.RECORDS:
                fire_request_events(self.runner.environment.events, data, self.request_type, self.name)
                self.send(
                    RECORDS,
                    {
                        "worker": self.worker,
                        "ipc": encode_records(data),
                        "_cpu_ratio": data.get("_cpu_ratio"),
                        "_in_flight": data.get("_in_flight"),
                    },
                )
            elif kind == frames.DONE:
                self._report_stats()
                self.send(DONE, {**data, "worker": self.worker})
                return
        rc = self.proc.wait()
        if not self.started:  # failed while preparing: its READY carried the error to the master
            return
        # The engine ended mid-run: exit, so the master marks this worker lost and keeps what it
        # already received (the run is partial).
        log.error("worker %d: sender engine exited (status %s) before finishing", self.worker, rc)
        os._exit(1)

    def _report_stats(self) -> None:
        """Send Locust's statistics now, before DONE, so the master's totals are final (workers
        otherwise report every 3 s)."""
        from locust.rpc import Message

        data: dict[str, Any] = {}
        self.runner.environment.events.report_to_master.fire(client_id=self.runner.client_id, data=data)
        self.runner.client.send(Message("stats", data, self.runner.client_id))


def run_worker(master_host: str, master_port: int) -> int:
    """Connect to a master, wait for a plan, run it, and exit when the master quits."""
    from locust.env import Environment
    from locust.rpc import Message

    if os.environ.get(LOCAL_WORKER_ENV) == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the sender engine it starts
    env = Environment(user_classes=[], events=None)
    runner = env.create_worker_runner(master_host, master_port)
    state: dict[str, EngineLink] = {}
    surplus: list[bool] = []

    def send(msg_type: str, data: Any) -> None:
        runner.send_message(msg_type, data)

    def on_plan(environment: Any, msg: Any, **_: Any) -> None:
        try:
            state["link"] = EngineLink(msg.data, send, runner)
        except Exception as exc:  # tell the master instead of dying silently
            log.exception("worker failed to start its sender")
            send(READY, {"worker": msg.data.get("worker", -1), "error": f"{type(exc).__name__}: {exc}"})

    def on_go(environment: Any, msg: Any, **_: Any) -> None:
        link = state.get("link")
        if link is not None:
            link.go(int(msg.data["epoch_unix_ns"]))

    def on_chunk(environment: Any, msg: Any, **_: Any) -> None:
        link = state.get("link")
        if link is not None:
            link.chunk(msg.data)

    def on_stop(environment: Any, msg: Any, **_: Any) -> None:
        link = state.get("link")
        if link is not None:
            link.stop(float(msg.data.get("grace_s", 0.0)))

    def on_surplus(environment: Any, msg: Any, **_: Any) -> None:
        why = msg.data.get("why", "not needed by this run")
        print(f"netgain load --worker: error: {why}", file=sys.stderr, flush=True)
        surplus.append(True)
        # Tell the master we are gone (it forgets this client at once), then stop.
        runner.client.send(Message("quit", None, runner.client_id))
        gevent.spawn(runner.quit)

    runner.register_message(PLAN, on_plan)
    runner.register_message(SURPLUS, on_surplus)
    runner.register_message(CHUNK, on_chunk)
    runner.register_message(GO, on_go)
    runner.register_message(STOP, on_stop)
    # Connecting can yield to Locust's receiving greenlet, so a plan sent as soon as we connect
    # could arrive before the handlers exist ("Unknown message type") and be lost: the master
    # deals plans only to workers that said hello.
    send(HELLO, {"pid": os.getpid()})
    try:
        runner.greenlet.join()
    finally:
        link = state.get("link")
        if link is not None and link.proc.poll() is None:
            link.proc.kill()
    return SURPLUS_EXIT if surplus else 0
