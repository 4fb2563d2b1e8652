"""Shared fixtures: real ``python -m netgain.server`` processes on 127.0.0.1, port 0.

``start_server(*args)`` launches the server with ``--port 0 --metrics-port 0 --ports-file F``
(plus ``--span-log`` unless given), waits for the ports file and for health SERVING within
a bounded time, and always stops the process at teardown (SIGTERM, then SIGKILL).
``start_server_module`` is the same factory with module scope, for servers shared by
several tests.

This file also holds small handlers for the tests (``conftest:SlowHandler``): the server
process imports them by ``module:Class`` with this directory on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from netgain.protos import InferenceStub, pb
from netgain.server.handlers.base import Handler, InvalidInput, NonFiniteOutput

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


# -- test handlers (imported by server processes as conftest:SlowHandler) -------------------
class SlowHandler(Handler):
    """No torch. Options: ``init_ms`` (sleep in the constructor: a slow handler set-up),
    ``load_ms`` (sleep in build_model: a window before SERVING) and
    ``forward_ms`` (sleep per batch: a slow device). Payload ``b"bad"`` is invalid input,
    ``b"nan"`` gives an output the model could not keep finite;
    payload ``b"slow"`` creates the file ``pre_mark`` (when given) and then sleeps ``pre_ms`` in
    preprocess; the output label is the payload's length."""

    name = "slow"
    uses_device = False

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.load_ms = self.int_option("load_ms", 0, lo=0)
        self.forward_ms = self.int_option("forward_ms", 0, lo=0)
        self.pre_ms = self.int_option("pre_ms", 0, lo=0)
        self.pre_mark = self.options.get("pre_mark", "")
        time.sleep(self.int_option("init_ms", 0, lo=0) / 1000)

    def build_model(self) -> Any:
        time.sleep(self.load_ms / 1000)
        return None

    def preprocess(self, item: pb.Input) -> Any:
        if item.data == b"bad":
            raise InvalidInput("payload is bad on purpose")
        if item.data == b"slow":
            if self.pre_mark:
                Path(self.pre_mark).touch()
            time.sleep(self.pre_ms / 1000)
        return -1 if item.data == b"nan" else len(item.data)

    def collate(self, items: list[Any]) -> Any:
        return list(items)

    def forward(self, model: Any, batch: Any) -> Any:
        time.sleep(self.forward_ms / 1000)
        return batch

    def postprocess(self, row: Any) -> pb.Output:
        if row == -1:
            raise NonFiniteOutput("model output is not finite (1 of 1 values NaN or infinite)")
        return pb.Output(label=int(row))

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        return pb.Input(data=b"x" * (size or 8))


# -- server processes ------------------------------------------------------------------------
def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETGAIN_")}
    paths = [str(TESTS_DIR), str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def netgain_cmd(*args: str) -> list[str]:
    """``netgain ARGS`` as the tests start it: this interpreter, the source tree on the path."""
    return [sys.executable, "-m", "netgain.cli", *args]


def run_netgain(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        netgain_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=server_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def read_rows(run_dir: Path) -> dict[str, Any]:
    """A run directory's requests.parquet as numpy columns."""
    import pyarrow.parquet as pq

    t = pq.read_table(run_dir / "requests.parquet")
    return {c: t.column(c).to_numpy(zero_copy_only=False) for c in t.column_names}


def read_meta(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "meta.json").read_text()))


def read_span_log(path: Path) -> list[dict[str, Any]]:
    """The span log's complete lines: one a server is still appending has no newline yet."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


class ServerHandle:
    """A running ``python -m netgain.server`` process and how to reach it."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        workdir: Path,
        ports_file: Path,
        span_log: Path | None,
        args: tuple[str, ...],
    ) -> None:
        self.proc = proc
        self.workdir = workdir
        self.ports_file = ports_file
        self.span_log = span_log
        self.args = args
        self.grpc_port = -1
        self.metrics_port = -1
        self.pid = proc.pid
        self._channel: grpc.Channel | None = None

    # -- start-up ------------------------------------------------------------------------
    def _check_alive(self) -> None:
        rc = self.proc.poll()
        if rc is not None:
            raise RuntimeError(f"server exited with {rc} during start-up: {self.output()}")

    def wait_ports(self, timeout_s: float = START_TIMEOUT_S) -> None:
        end = time.monotonic() + timeout_s
        while not self.ports_file.exists():
            self._check_alive()
            if time.monotonic() > end:
                raise TimeoutError(f"no ports file after {timeout_s:.0f} s: {self.output()}")
            time.sleep(0.02)
        ports = json.loads(self.ports_file.read_text())
        self.grpc_port, self.metrics_port, self.pid = (
            int(ports["grpc"]),
            int(ports["metrics"]),
            int(ports["pid"]),
        )

    def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
        return int(resp.status)

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        end = time.monotonic() + timeout_s
        if self.grpc_port < 0:
            self.wait_ports(timeout_s)
        while True:
            self._check_alive()
            try:
                if self.health() == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"health not SERVING after {timeout_s:.0f} s: {self.output()}")
            time.sleep(0.05)

    # -- clients -------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.target)
        return self._channel

    def stub(self) -> InferenceStub:
        return InferenceStub(self.channel)

    def metrics_text(self, openmetrics: bool = False) -> str:
        req = urllib.request.Request(f"http://{HOST}:{self.metrics_port}/metrics")
        if openmetrics:
            req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return str(resp.read().decode("utf-8"))

    def span_lines(self) -> list[dict[str, Any]]:
        return read_span_log(self.span_log) if self.span_log is not None else []

    def output(self) -> str:
        out = (self.workdir / "stdout.txt").read_text(errors="replace")
        err = (self.workdir / "stderr.txt").read_text(errors="replace")
        return f"\n--- stdout ---\n{out}\n--- stderr ---\n{err[-4000:]}"

    def stdout(self) -> str:
        return (self.workdir / "stdout.txt").read_text(errors="replace")

    # -- shutdown ------------------------------------------------------------------------
    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait for the exit status; SIGKILL if it does not come in time."""
        self.close_channel()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10.0)
        return int(self.proc.returncode)


class ServerLauncher:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.handles: list[ServerHandle] = []

    def __call__(self, *args: str, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> ServerHandle:
        workdir = self.root / f"server{len(self.handles)}"
        workdir.mkdir(parents=True)
        ports_file = workdir / "ports.json"
        cmd = [
            sys.executable,
            "-m",
            "netgain.server",
            "--host",
            HOST,
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--ports-file",
            str(ports_file),
        ]
        span_log: Path | None = None
        if "--span-log" in args:
            span_log = Path(args[args.index("--span-log") + 1])
        else:
            span_log = workdir / "spans.jsonl"
            cmd += ["--span-log", str(span_log)]
        cmd += list(args)
        with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=server_env()
            )
        handle = ServerHandle(proc, workdir, ports_file, span_log, tuple(args))
        self.handles.append(handle)
        if wait:
            handle.wait_serving(timeout_s)
        return handle

    def close_all(self) -> None:
        for handle in self.handles:  # signal all first: they drain in parallel
            handle.close_channel()
            if handle.proc.poll() is None:
                handle.proc.send_signal(signal.SIGTERM)
        for handle in self.handles:
            handle.terminate()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerLauncher]:
    """Factory: ``start_server("--model", "null", ...)`` → a SERVING ServerHandle, stopped at teardown."""
    launcher = ServerLauncher(tmp_path / "servers")
    try:
        yield launcher
    finally:
        launcher.close_all()


@pytest.fixture(scope="module")
def start_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerLauncher]:
    """``start_server`` with module scope: for servers that several tests share."""
    launcher = ServerLauncher(tmp_path_factory.mktemp("servers"))
    try:
        yield launcher
    finally:
        launcher.close_all()
