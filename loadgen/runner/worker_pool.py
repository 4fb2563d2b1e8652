"""The master's side of its Locust workers: local ones started, all of them greeted and numbered,
their READY and DONE messages kept, and the ones that vanish marked lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import gevent

from netgain.contract.messages import SURPLUS
from netgain.errors import NetgainError


class Interrupted(Exception):
    """The user interrupted the run (Ctrl-C) while the master waited for its workers."""


class WorkerPool:
    def __init__(self, local: int, remote: int, say: Callable[[str], None]) -> None:
        self.local = local
        self.total = local + remote
        self.say = say
        self.master_port = 0
        self.index_of: dict[str, int] = {}  # Locust client id → worker number
        self.ready: dict[int, dict[str, Any]] = {}
        self.done: dict[int, dict[str, Any]] = {}
        self.lost: dict[int, float] = {}  # worker → seconds since the epoch when lost
        self.hello: set[str] = set()  # Locust client ids of workers ready for a plan
        self.last_seen: dict[int, float] = {}  # worker → monotonic time of its last records
        self.procs: list[subprocess.Popen[bytes]] = []
        self._runner: Any = None  # set once the workers are numbered: later hellos are surplus
        self.interrupted = False  # set by the master's SIGINT handler: stop waiting

    # -- message handlers (run in the master's receive greenlet) -------------------------
    def on_hello(self, environment: Any, msg: Any, **_: Any) -> None:
        self.hello.add(msg.node_id)
        if self._runner is not None and msg.node_id not in self.index_of:
            self._surplus(msg.node_id)

    def _surplus(self, cid: str) -> None:
        """A worker beyond the ones numbered (``--scale`` above ``--remote-workers``, or one that
        connects once the run has its workers): told to exit with a line saying why, never left
        idle to exit 0 at the end as if it had taken part."""
        why = (
            f"this run expects {self.total} worker(s) and has them all; this one is surplus "
            "(compose: set NETGAIN_REMOTE_WORKERS to the --scale locust-worker=N count)"
        )
        self.say(f"a worker connected beyond the {self.total} expected; told to exit")
        self._runner.send_message(SURPLUS, {"why": why}, client_id=cid)

    def on_ready(self, environment: Any, msg: Any, **_: Any) -> None:
        self.ready[int(msg.data["worker"])] = msg.data

    def on_done(self, environment: Any, msg: Any, **_: Any) -> None:
        self.done[int(msg.data["worker"])] = msg.data

    def seen(self, worker: int) -> None:
        """``worker`` sent records just now: it is alive whatever its heartbeats say."""
        self.last_seen[worker] = time.monotonic()

    # -- start-up ----------------------------------------------------------------------------
    def start_local(self, master_port: int) -> None:
        self.master_port = master_port
        for _ in range(self.local):
            self.procs.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "netgain.loadgen.runner",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(self.master_port),
        ]
        from netgain.loadgen.runner.worker import LOCAL_WORKER_ENV

        env = {**os.environ, LOCAL_WORKER_ENV: "1"}
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)

    def await_connected(self, runner: Any, timeout_s: float = 60.0) -> None:
        """Wait until every worker has said hello, then number them in client-id order."""
        deadline = time.monotonic() + timeout_s
        respawns = 0

        def greeted() -> list[str]:
            return sorted(cid for cid in runner.clients if cid in self.hello)

        while len(greeted()) < self.total:
            if self.interrupted:
                raise Interrupted
            if time.monotonic() > deadline:
                raise NetgainError(
                    f"only {len(greeted())} of {self.total} workers connected within {timeout_s:.0f} s"
                )
            for k, p in enumerate(self.procs):
                if p.poll() is None:
                    continue
                # Nothing was sent yet, so a worker that died starting (an overloaded host) is
                # simply started again, twice at most.
                if respawns >= 2:
                    raise NetgainError("a local worker exited during start-up; run with --debug to see why")
                respawns += 1
                self.say(f"a local worker exited during start-up (status {p.returncode}); starting another")
                self.procs[k] = self._spawn()
            gevent.sleep(0.1)
        for i, cid in enumerate(greeted()[: self.total]):
            self.index_of[cid] = i
        self._runner = runner
        for cid in greeted()[self.total :]:
            self._surplus(cid)

    def await_ready(self, timeout_s: float = 300.0) -> None:
        """Wait for every worker's READY (its payloads built); a worker's error fails the run."""
        deadline = time.monotonic() + timeout_s
        while len(self.ready) < self.total:
            if self.interrupted:
                raise Interrupted
            if time.monotonic() > deadline:
                raise NetgainError(f"workers did not finish building payloads within {timeout_s:.0f} s")
            gevent.sleep(0.05)
        errors = [r["error"] for r in self.ready.values() if "error" in r]
        if errors:
            raise NetgainError(f"a worker could not prepare its requests: {errors[0]}")

    # -- during the run ----------------------------------------------------------------------
    def finished(self) -> bool:
        return len(self.done) + len(self.lost) >= self.total

    def check_lost(self, runner: Any, now_s: float) -> None:
        """Mark lost the workers Locust reports missing (and silent) and local ones that exited."""
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
                self.lost[i] = now_s
                self.say(f"worker {i} lost at {now_s:.1f} s; keeping what it sent, the run is partial")

    def lose_unfinished(self, now_s: float) -> None:
        for i in self.index_of.values():
            if i not in self.done and i not in self.lost:
                self.lost[i] = now_s

    def connected(self, runner: Any) -> int:
        return len(runner.clients) - len(self.lost)

    # -- afterwards --------------------------------------------------------------------------
    def reap(self) -> None:
        """Wait for the local worker processes to exit (10 s each), killing those that do not."""
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    def cpu(self) -> dict[int, float]:
        """Each finished worker's CPU ratio over the run, as its DONE message reports it."""
        return {w: float(d.get("cpu_ratio", 0.0)) for w, d in self.done.items()}
