"""deploy/prometheus and the dashboards' queries, proven against a real Prometheus.

A real `python -m netgain.server --model null` process serves traffic from a small bounded gRPC
client loop (with some failing requests, so error series exist); a real Prometheus (the
Debian package's binary) scrapes it every second with deploy/'s rules. Then every PromQL
expression of the dashboards and rules is evaluated through /api/v1/query and must return
data. Two kinds are exempt, and say so in their test ids:

- GPU-only expressions (they read netgain_gpu_*, which a host without a GPU never exports)
  must be valid queries; their rules are exercised on synthetic series by
  deploy/prometheus/tests/rules_test.yml (`promtool test rules`).
- Client expressions (netgain_client_*, exported by the `netgain load` master) need the
  load generator: the stack runs `netgain load --metrics-port` beside the server, and Prometheus
  scrapes the master too (in a tree without `netgain.cli.load` they would be xfail, saying why).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from netgain.experiments.orchestrate import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"

_spec = importlib.util.spec_from_file_location("netgain_check_queries", DEPLOY / "tools" / "check_queries.py")
assert _spec and _spec.loader
cq = importlib.util.module_from_spec(_spec)
sys.modules["netgain_check_queries"] = cq
_spec.loader.exec_module(cq)

LOADGEN_RUNNABLE = importlib.util.find_spec("netgain.cli.load") is not None
CLIENT_PENDING = (
    "client metrics need `netgain load` (netgain.cli.load not importable yet): pending the load generator"
)
SETTLE_S = 45.0  # longest wait for every expected query to have data

QUERIES = cq.all_queries()


def binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} not found on PATH; CI must install the Debian package `prometheus`")
    pytest.skip(f"{name} not installed (apt-get install prometheus); CI is not set, so skipping")


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def stop(proc: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM the process's own group (it was started in a new session), then SIGKILL the group."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children left behind (e.g. load-generator workers)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# -- static checks: promtool --------------------------------------------------------------------


@pytest.mark.slow
def test_promtool_check_config() -> None:
    out = subprocess.run(
        [binary("promtool"), "check", "config", str(PROM_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_check_rules() -> None:
    files = sorted(str(p) for p in (PROM_DIR / "rules").glob("*.yml"))
    assert len(files) >= 2
    out = subprocess.run(
        [binary("promtool"), "check", "rules", *files], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_rule_unit_tests() -> None:
    """GPU-only and load-generator alerts fire on synthetic series (no GPU, no loadgen needed)."""
    out = subprocess.run(
        [binary("promtool"), "test", "rules", "rules_test.yml"],
        cwd=PROM_DIR / "tests",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_scrape_jobs_are_the_ones_rules_expect() -> None:
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    jobs = {sc["job_name"]: sc for sc in cfg["scrape_configs"]}
    assert {"netgain-server", "netgain-loadgen"} <= set(jobs)
    for job in ("netgain-server", "netgain-loadgen"):
        interval = cq_duration_s(jobs[job].get("scrape_interval", cfg["global"]["scrape_interval"]))
        assert 1 <= interval <= 5, f"{job}: scrape every 1-5 s, not {interval}"
    ports = {sd["port"] for sd in jobs["netgain-server"]["dns_sd_configs"]}
    assert ports == {9464}, "server metrics port is --metrics-port's default, 9464"
    assert {sd["port"] for sd in jobs["netgain-loadgen"]["dns_sd_configs"]} == {9465}
    for q in QUERIES:
        for job in _jobs_in(q.expr):
            assert job in jobs, f"{q.id} filters on job {job!r}, which prometheus.yml does not scrape"


def cq_duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(text)


def _jobs_in(expr: str) -> list[str]:
    import re

    return re.findall(r'job="([^"]+)"', expr)


def test_metric_names_exist() -> None:
    """Every netgain_* name in the rules and dashboards is one the server or the client exports."""
    from prometheus_client import CollectorRegistry

    from netgain.server.telemetry.metrics import ServerMetrics

    reg = CollectorRegistry()
    m = ServerMetrics(reg, "null", "cpu")
    m.enable_gpu()
    names: set[str] = set()
    for family in reg.collect():
        names.add(family.name)
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "info":
            names.add(family.name + "_info")
        if family.type == "histogram":
            names |= {family.name + sfx for sfx in ("_bucket", "_sum", "_count")}
    server = {n for n in names if n.startswith(("netgain_", "process_"))}
    assert "process_cpu_seconds_total" in server  # ProcessCollector on the server's registry
    # Prometheus conventions: what rate() derives from a counter is not exported again as a gauge.
    fams = {f.name: f.type for f in reg.collect()}
    assert fams["netgain_server"] == "info" and fams["netgain_thread_cpu_seconds"] == "counter"
    gauges = {"netgain_kernel_busy_ratio", "netgain_process_cpu_ratio", "netgain_thread_cpu_ratio"}
    assert not gauges & set(fams)
    if LOADGEN_RUNNABLE:  # the load generator's own definitions are the truth
        from netgain.loadgen.runner.live import ClientMetrics

        creg = CollectorRegistry()
        ClientMetrics(creg)
        client = set()
        for family in creg.collect():
            client |= {family.name, *(s.name for s in family.samples)}
            if family.type == "counter":
                client.add(family.name + "_total")
            if family.type == "histogram":
                client |= {family.name + sfx for sfx in ("_bucket", "_sum", "_count")}
            assert not family.name.endswith("_rps"), f"{family.name}: a rate gauge (export a counter)"
    else:
        client_base = {"netgain_client_latency_seconds", "netgain_client_send_lag_seconds"}
        client = {f"{b}{sfx}" for b in client_base for sfx in ("_bucket", "_sum", "_count")} | {
            "netgain_client_requests_total",
            "netgain_client_dropped_total",
            "netgain_client_scheduled_requests_total",
            "netgain_client_in_flight_requests",
            "netgain_client_workers",
        }
    known = server | client
    gpu_names = {n for n in server if n.startswith("netgain_gpu_")}
    assert len(gpu_names) == 5
    for q in QUERIES:
        unknown = cq.metric_names(q, QUERIES) - known
        assert not unknown, f"{q.id} reads {sorted(unknown)}, which nothing exports (typo?)"


def test_gpu_only_and_client_lists_are_what_they_claim() -> None:
    gpu = [q.id for q in QUERIES if cq.is_gpu_only(q, QUERIES)]
    assert any("NetgainGpuMemoryNearFull" in i for i in gpu)
    assert any(i.startswith("dashboard:") and "GPU power" in i for i in gpu)
    # the kernel busy ratio sits beside the GPU gauges but exists on cpu too
    assert not any("kernel_busy" in q.expr and q.id in gpu for q in QUERIES)
    assert len(gpu) < len(QUERIES) // 4


def test_alert_signals_split() -> None:
    assert cq.alert_signals('a > (1 * 2)\nand\nb{x="<"} < 3') == ["a > bool (1 * 2)", 'b{x="<"} < bool 3']
    assert cq.alert_signals("up == 0") == ["up == bool 0"]
    assert cq.alert_signals("sum by (a) (rate(x[1m])) > bool 0") == ["sum by (a) (rate(x[1m])) > bool 0"]


# -- the live stack -------------------------------------------------------------------------------


class Traffic:
    """A small bounded client: bursts of concurrent requests (so batches form), a few bad ones."""

    def __init__(self, target: str, max_s: float = 150.0) -> None:
        import grpc

        from netgain.protos import inference_pb2 as pb
        from netgain.protos.service import InferenceStub

        self.pb = pb
        self.channel = grpc.insecure_channel(target)
        self.stub = InferenceStub(self.channel)
        self.max_s = max_s
        self.sent = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-traffic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.channel.close()

    def _run(self) -> None:
        pb = self.pb
        started = time.monotonic()
        i = 0
        while not self._stop.is_set() and time.monotonic() - started < self.max_s:
            futures = []
            for k in range(1 + i % 6):
                inputs = [pb.Input(data=b"x" * (16 + k))] * (1 + k % 3)
                req = pb.InferRequest(inputs=inputs)
                if i % 10 == 0 and k == 0:
                    req = pb.InferRequest(model="no-such-model", inputs=inputs)  # NOT_FOUND
                elif i % 15 == 0 and k == 0:
                    req = pb.InferRequest()  # INVALID_ARGUMENT: no inputs
                md = (("x-request-id", f"deploy-test-{uuid.uuid4().hex[:16]}"),)
                futures.append(self.stub.Infer.future(req, metadata=md, timeout=5))
            for f in futures:
                try:
                    f.result()
                except Exception:
                    self.errors += 1
                self.sent += 1
            i += 1
            self._stop.wait(0.02)


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.server: subprocess.Popen[Any] | None = None
        self.loadgen: subprocess.Popen[Any] | None = None
        self.prometheus: subprocess.Popen[Any] | None = None
        self.traffic: Traffic | None = None
        self.prom_url = ""
        self.grpc_port = 0
        self.metrics_port = 0
        self.client_port = 0
        self.logs: dict[str, Path] = {}

    def _spawn(self, name: str, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        fh = open(log, "wb")  # noqa: SIM115 - closed with the process below
        try:
            return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        finally:
            fh.close()

    def log_tail(self, name: str, n: int = 3000) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace")[-n:] if path and path.exists() else ""

    def start_server(self) -> None:
        ports = self.tmp / "ports.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.server = self._spawn(
            "server",
            [
                sys.executable,
                "-m",
                "netgain.server",
                "--model",
                "null",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--ports-file",
                str(ports),
                "--max-batch-size",
                "8",
                "--max-queue-delay-ms",
                "2",
                "--sample-interval-s",
                "0.5",
                "--grace-s",
                "2",
            ],
            cwd=ROOT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while not ports.exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + self.log_tail("server"))
            time.sleep(0.1)
        info = json.loads(ports.read_text())
        self.grpc_port, self.metrics_port = info["grpc"], info["metrics"]
        self._wait_serving(deadline)

    def _wait_serving(self, deadline: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < deadline:
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise RuntimeError("server never became SERVING:\n" + self.log_tail("server"))

    def start_loadgen(self) -> None:
        """The real `netgain load` master with its client metrics (once the load generator exists)."""
        self.client_port = free_port()
        self.loadgen = self._spawn(
            "loadgen",
            [
                sys.executable,
                "-m",
                "netgain.cli",
                "load",
                "--target",
                f"127.0.0.1:{self.grpc_port}",
                "--arrival",
                "poisson",
                "--rate",
                "50",
                "--duration",
                "90",
                "--workers",
                "1",
                "--out",
                str(self.tmp / "run"),
                "--metrics-port",
                str(self.client_port),
            ],
            cwd=ROOT,
        )

    def start_prometheus(self) -> None:
        deploy_cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
        scrape = [
            {
                "job_name": "netgain-server",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{self.metrics_port}"], "labels": {"service": "server-cpu"}}
                ],
            }
        ]
        if self.client_port:
            scrape.append(
                {
                    "job_name": "netgain-loadgen",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "static_configs": [{"targets": [f"127.0.0.1:{self.client_port}"]}],
                }
            )
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str((PROM_DIR / f).resolve()) for f in deploy_cfg["rule_files"]],
            "scrape_configs": scrape,
        }
        path = self.tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        port = free_port()
        self.prom_url = f"http://127.0.0.1:{port}"
        self.prometheus = self._spawn(
            "prometheus",
            [
                binary("prometheus"),
                f"--config.file={path}",
                f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--enable-feature=exemplar-storage",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            cwd=self.tmp,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.prometheus.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log_tail("prometheus"))
            try:
                http_get(self.prom_url + "/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus not ready in 30 s:\n" + self.log_tail("prometheus"))

    def expected(self, q: Any) -> bool:
        return not cq.is_gpu_only(q, QUERIES) and (LOADGEN_RUNNABLE or not cq.is_client(q, QUERIES))

    def settle(self) -> None:
        """Wait (bounded) until every query that should have data has it."""
        deadline = time.monotonic() + SETTLE_S
        pending = [q for q in QUERIES if self.expected(q)]
        while pending and time.monotonic() < deadline:
            pending = [q for q in pending if cq.check(self.prom_url, q, require_data=True)]
            if pending:
                time.sleep(1.0)

    def close(self) -> None:
        if self.traffic:
            self.traffic.stop()
        for proc in (self.loadgen, self.prometheus, self.server):
            stop(proc)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary("prometheus")
    s = Stack(tmp_path_factory.mktemp("deploy-prometheus"))
    try:
        s.start_server()
        s.traffic = Traffic(f"127.0.0.1:{s.grpc_port}")
        s.traffic.start()
        if LOADGEN_RUNNABLE:
            s.start_loadgen()
        s.start_prometheus()
        s.settle()
        yield s
    finally:
        s.close()


def _param(q: Any) -> Any:
    marks = []
    kind = "gpu-only" if cq.is_gpu_only(q, QUERIES) else "client" if cq.is_client(q, QUERIES) else "server"
    if kind == "client" and not LOADGEN_RUNNABLE:
        marks.append(pytest.mark.xfail(reason=CLIENT_PENDING, strict=False))
    return pytest.param(q, id=f"{kind}:{q.id}", marks=marks)


@pytest.mark.slow
def test_targets_up(stack: Stack) -> None:
    body = json.loads(http_get(stack.prom_url + "/api/v1/targets"))
    health = {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
    assert health.get("netgain-server") == "up", body
    if LOADGEN_RUNNABLE:
        assert health.get("netgain-loadgen") == "up", stack.log_tail("loadgen")
    assert stack.traffic and stack.traffic.sent > 0


@pytest.mark.slow
@pytest.mark.parametrize("query", [_param(q) for q in QUERIES])
def test_query_returns_data(stack: Stack, query: Any) -> None:
    gpu_only = cq.is_gpu_only(query, QUERIES)
    err = cq.check(stack.prom_url, query, require_data=not gpu_only)
    if err and cq.is_client(query, QUERIES) and stack.loadgen is not None:
        err += "\nloadgen log:\n" + stack.log_tail("loadgen")
    assert err is None, err


@pytest.mark.slow
def test_latency_exemplars_carry_request_ids(stack: Stack) -> None:
    """The dashboards' exemplar links need request ids on the server's latency buckets."""
    now = time.time()
    params = urllib.parse.urlencode(
        {"query": "netgain_request_duration_seconds_bucket", "start": now - 300, "end": now + 5}
    )
    body = json.loads(http_get(f"{stack.prom_url}/api/v1/query_exemplars?{params}"))
    assert body["status"] == "success", body
    ids = [e["labels"].get("request_id", "") for series in body["data"] for e in series["exemplars"]]
    assert ids and all(i for i in ids), body
    assert any(i.startswith("deploy-test-") for i in ids), ids[:5]


@pytest.mark.slow
def test_rules_evaluate_without_errors(stack: Stack) -> None:
    """Rule health as Prometheus reports it (catches e.g. many-to-many matches a query alone would hide)."""
    body = json.loads(http_get(stack.prom_url + "/api/v1/rules"))
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert len(rules) == sum(1 for q in QUERIES if q.source in ("recording", "alert"))
    bad = {r["name"]: r.get("lastError") for r in rules if r.get("health") == "err"}
    assert not bad, bad
