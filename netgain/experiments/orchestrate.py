"""Start servers and load runs as child processes: what `demo`, `compare` and `drill` are made of."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from netgain.contract.cores import cpu_list
from netgain.errors import NetgainError


def free_port() -> int:
    """A port free on 127.0.0.1 now, for servers that must share or pre-announce one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_cpus(text: str, flag: str, usable: set[int]) -> list[int]:
    """``0-11,14`` (or ``all``: every usable core) as a sorted list; one-line error otherwise."""
    if text == "all":
        return sorted(usable)
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise NetgainError(f"{flag} {text!r}: use core numbers and ranges such as 0-11,14, or all") from None
    if not cpus or not cpus <= usable:
        raise NetgainError(f"{flag} {text!r}: the usable cores are {cpu_list(sorted(usable))}")
    return sorted(cpus)


@dataclass(frozen=True)
class Placement:
    """Which cores the servers and the load generator of an experiment run on."""

    server: list[int]
    load: list[int]

    @property
    def separate(self) -> bool:
        return not set(self.server) & set(self.load)

    def load_workers(self, requested: int = 0) -> int:
        """``requested`` load workers, or by default one per load-generator core when those are the
        load generator's own, else one."""
        return requested or (len(self.load) if self.separate else 1)

    def describe_load(self, workers: int, connections: int) -> str:
        """The placement and what the load generator runs there."""
        return f"{self.describe()}; load generator {workers} worker(s) x {connections} connection(s)"

    def describe(self) -> str:
        if self.separate:
            return (
                f"placement: server on cores {cpu_list(self.server)}, "
                f"load generator on cores {cpu_list(self.load)}"
            )
        shared = cpu_list(sorted(set(self.server) & set(self.load)))
        return (
            f"placement SHARED: server and load generator both run on cores {shared}, so latencies "
            "include their contention (separate cores: --server-cpus/--load-cpus, or 8 usable cores for auto)"
        )


def choose_placement(
    server_cpus: str = "auto", load_cpus: str = "auto", usable: set[int] | None = None
) -> Placement:
    """``auto`` for both: with 8 usable cores or more, the highest quarter (at least 2) loads and the
    rest serves; below that both share every core. One side given, auto takes the other cores."""
    usable = set(os.sched_getaffinity(0)) if usable is None else usable
    ordered = sorted(usable)
    if server_cpus == "auto" and load_cpus == "auto":
        if len(ordered) < 8:
            return Placement(ordered, ordered)
        n_load = max(2, len(ordered) // 4)
        return Placement(ordered[:-n_load], ordered[-n_load:])
    server = parse_cpus(server_cpus, "--server-cpus", usable) if server_cpus != "auto" else None
    load = parse_cpus(load_cpus, "--load-cpus", usable) if load_cpus != "auto" else None
    if server is None:
        server = sorted(usable - set(load or []))
    if load is None:
        load = sorted(usable - set(server))
    if not server or not load:
        raise NetgainError("--server-cpus and --load-cpus leave one side no core: give it some, or all")
    both_all = server_cpus == load_cpus == "all"
    if set(server) & set(load) and not both_all:
        raise NetgainError(
            f"--server-cpus and --load-cpus overlap on cores {cpu_list(sorted(set(server) & set(load)))}: "
            "give them separate cores, or all for both to share every core"
        )
    return Placement(server, load)


@contextlib.contextmanager
def pinned(cpus: Collection[int] | None) -> Iterator[None]:
    """Children started inside run on ``cpus`` (None: where the parent is): the calling thread's
    affinity, which a child inherits, is set and then restored. Not a preexec_fn: with one,
    subprocess forks instead of vforking, and fork() runs gRPC's at-fork handler, which can block
    forever in a process that has used a channel."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)  # pid 0: this thread only, on Linux
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class ServerProcess:
    """``python -m netgain.server ...`` on 127.0.0.1 with free ports; stopped with SIGTERM (drain) on exit."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: str | None = None,
        ready_timeout_s: float = 300.0,
        port: int = 0,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.args = list(args)
        self.cpus = cpus  # the server's cores (None: the caller's)
        self.port = port  # a fixed port lets several servers share it (SO_REUSEPORT)
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self._tmp = tempfile.mkdtemp(prefix="netgain-")
        self.ports_file = os.path.join(self._tmp, "ports.json")
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_port = 0
        self.metrics_port = -1
        self.spawned_at = 0.0
        self._log_from = 0  # where this start's lines begin in the log

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "netgain.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            "0",
            "--ports-file",
            self.ports_file,
            *self.args,
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._log_from = os.path.getsize(self.log_path) if self.log_path else 0
        self.spawned_at = time.time()
        with pinned(self.cpus):
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT if self.log_path else None, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 60.0
        while not os.path.exists(self.ports_file):
            if self.proc.poll() is not None:
                raise NetgainError(self._exited("during start-up"))
            if time.monotonic() > deadline:
                self.stop()
                raise NetgainError("server did not bind its ports within 60 s")
            time.sleep(0.05)
        with open(self.ports_file) as fh:
            ports = json.load(fh)
        self.grpc_port, self.metrics_port = int(ports["grpc"]), int(ports["metrics"])
        self.pid = int(ports["pid"])
        return self

    def wait_ready(self) -> float:
        """Block until health is SERVING; returns seconds since spawn.

        Watches the health stream rather than polling Check, so the instant is the server's own
        transition (plus one loopback hop), not the next poll after it: a load already running
        against this address must not see a success before the SERVING it is compared with.
        """
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + self.ready_timeout_s
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise NetgainError(self._exited("while loading the model"))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NetgainError(f"server not SERVING within {self.ready_timeout_s:.0f} s")
                try:
                    # a short deadline per stream so a server that dies while loading is noticed
                    for resp in stub.Watch(health_pb2.HealthCheckRequest(), timeout=min(left, 1.0)):
                        if resp.status == health_pb2.HealthCheckResponse.SERVING:
                            return time.time() - self.spawned_at
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        raise NetgainError(
                            f"{self.target} has no grpc.health.v1 service to wait on"
                        ) from None
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        # The stream's own deadline: watch again at once (a new stream sends the
                        # current status first), or a transition in the pause is seen late.
                        continue
                time.sleep(0.01)  # the stream was refused or ended before SERVING: look again

    def reason(self) -> str:
        """The server's own last word in its log since this start: its one-line ``error:``, else
        its last line ("" without a log)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_from)
                lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        errors = [ln for ln in lines if "error:" in ln]
        return (errors or lines or [""])[-1][:500]

    def _exited(self, when: str) -> str:
        assert self.proc is not None
        why = self.reason()
        return (
            f"server exited with status {self.proc.returncode} {when}"
            + (f": {why}" if why else "")
            + (f" (log: {self.log_path})" if self.log_path else "")
        )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# How long an interrupted child gets to stop in order (a load run: its requests in flight, its rows).
CHILD_STOP_S = 20.0


def run_child(
    cmd: Sequence[str], stdout: Any = None, stderr: Any = None, stop_s: float = CHILD_STOP_S
) -> int:
    """``cmd`` to its end, its exit status. On Ctrl-C the child, which the terminal interrupted too,
    stops in order (a load run writes every row and tells its workers to quit) before this re-raises:
    it gets ``stop_s``, then one SIGINT of its own (where the signal reached only this process), then
    ``stop_s`` more, and only then is killed (a killed load run leaves its workers waiting for it)."""
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        for forward in (False, True):
            if forward:
                proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(stop_s)
                break
        else:
            proc.kill()
            proc.wait()
        raise


def run_load(
    args: Sequence[str],
    quiet: bool = False,
    force: bool = True,
    cpus: Sequence[int] | None = None,
    stdout: Any = None,
) -> int:
    """``netgain load ARGS`` in a child process (it patches the standard library for gevent).
    ``force``: the experiments own their run directories and replace a run there (``--force``);
    ``cpus``: the load generator's cores (its workers inherit them); ``stdout``: where its result
    lines go (the caller's stdout by default)."""
    cmd = [sys.executable, "-m", "netgain.cli", "load", *args]
    if quiet:
        cmd.append("--quiet")
    if force:
        cmd.append("--force")
    with pinned(cpus):
        return run_child(cmd, stdout=stdout)
