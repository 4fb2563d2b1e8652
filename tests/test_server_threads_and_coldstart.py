"""CPU of torch's worker threads counted as ``compute``, and cold start measured from the true creation."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO_ROOT, ServerLauncher
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from netgain.protos import InferenceStub, pb
from netgain.server.coldstart import COLD_START_PHASES
from netgain.server.procstat import STARTTIME, stat_fields
from netgain.server.telemetry import samplers
from netgain.server.telemetry.samplers import read_thread_cpu, thread_role
from netgain.server.threadnames import name_os_thread, own_threads

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


# -- bug 1: threads that inherit one of our names ------------------------------------------------
def test_thread_role_by_id_first() -> None:
    own = {12: "ng-device-0", 13: "ng-prepost_1", 14: "ng-batcher"}
    assert thread_role("python", 10, 10, own) == "frontend"
    assert thread_role("ng-device-0", 12, 10, own) == "device"
    assert thread_role("ng-prepost_1", 13, 10, own) == "prepost"
    assert thread_role("ng-batcher", 14, 10, own) == "batcher"
    # The same names on threads that are not ours: copied from the thread that started them.
    assert thread_role("ng-device-0", 20, 10, own) == "compute"
    assert thread_role("ng-prepost_1", 21, 10, own) == "compute"
    assert thread_role("netgain-device-0", 22, 10, own) == "compute"
    # Names that are not ours still decide for other threads.
    assert thread_role("grpc_global_tim", 23, 10, own) == "grpc"
    assert thread_role("default-executo", 24, 10, own) == "grpc"
    assert thread_role("python", 25, 10, own) == "compute"
    # A registered thread is known by its recorded name, whatever its comm says now.
    assert thread_role("python", 12, 10, own) == "device"
    # Without the registry (another process), the name alone decides, as before.
    assert thread_role("ng-device-0", 20, 10) == "device"


class Burner:
    def __init__(self) -> None:
        self.tid = 0
        self.cpu_s = 0.0  # the burning thread's own CPU time so far

    def wait_cpu(self, seconds: float, limit_s: float = 10.0) -> None:
        """Until the thread has had ``seconds`` of CPU: on a loaded machine wall time says little."""
        deadline = time.monotonic() + limit_s
        while self.cpu_s < seconds and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.cpu_s >= seconds, f"the burner got {self.cpu_s:.2f} s of CPU in {limit_s:.0f} s"


@contextlib.contextmanager
def worker_of_named_thread() -> Iterator[Burner]:
    """A thread named ``ng-device-9`` starts an unnamed thread that burns CPU."""
    stop = threading.Event()
    started = threading.Event()
    burner = Burner()

    def burn() -> None:
        burner.tid = threading.get_native_id()
        started.set()
        deadline = time.monotonic() + 15.0
        while not stop.is_set() and time.monotonic() < deadline:
            sum(range(1000))
            burner.cpu_s = time.thread_time()

    def device() -> None:
        name_os_thread()
        child = threading.Thread(target=burn, name="unnamed-worker")  # never calls name_os_thread
        child.start()
        child.join()

    parent = threading.Thread(target=device, name="netgain-device-9")
    parent.start()
    try:
        assert started.wait(5.0)
        yield burner
    finally:
        stop.set()
        parent.join(15.0)


@linux_only
def test_worker_of_a_named_thread_counts_as_compute() -> None:
    """A thread started by ``ng-device-9`` inherits that OS name; its CPU goes to compute."""
    before = read_thread_cpu()
    with worker_of_named_thread() as burner:
        tid = burner.tid
        burner.wait_cpu(0.3)
        with open(f"/proc/self/task/{tid}/comm") as fh:
            comm = fh.read().strip()
        during = read_thread_cpu()
        assert tid not in own_threads()
    assert comm == "ng-device-9"  # the copied name the sampler must see through
    assert during.get("compute", 0.0) - before.get("compute", 0.0) >= 0.2, (before, during)
    assert during.get("device", 0.0) - before.get("device", 0.0) < 0.1, (before, during)


@linux_only
def test_stale_record_of_a_reused_id_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id recorded for a thread that has ended may come back on another: start times differ."""
    before = read_thread_cpu()
    with worker_of_named_thread() as burner:
        tid = burner.tid
        burner.wait_cpu(0.3)
        monkeypatch.setattr(samplers, "own_threads", lambda: {tid: ("ng-device-9", 1)})
        stale = read_thread_cpu()
        start = int(stat_fields(f"/proc/self/task/{tid}/stat")[STARTTIME])
        monkeypatch.setattr(samplers, "own_threads", lambda: {tid: ("ng-device-9", start)})
        live = read_thread_cpu()
    assert stale.get("device", 0.0) - before.get("device", 0.0) < 0.1, (before, stale)
    assert live.get("device", 0.0) - before.get("device", 0.0) >= 0.2, (before, live)


def png(size: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), color=(120, 30, 200)).save(buf, format="PNG")
    return buf.getvalue()


def role_seconds(text: str) -> dict[str, float]:
    """The ``netgain_thread_cpu_seconds_total`` counters by role."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "netgain_thread_cpu_seconds":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["role"]] = s.value
    return out


@pytest.mark.slow
@linux_only
def test_image_server_reports_compute_cpu(start_server: ServerLauncher) -> None:
    """torch's second intra-op thread does half the forward pass; it must not read as device."""
    server = start_server(
        "--model",
        "image",
        "--device",
        "cpu",
        "--intra-op-threads",
        "2",
        "--handler-option",
        "size=96",
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "2",
        "--warmup-batches",
        "1",
        "--sample-interval-s",
        "0.25",
    )
    stub = server.stub()
    request = pb.InferRequest(inputs=[pb.Input(data=png())])
    stop = threading.Event()

    def client() -> int:
        done = 0
        while not stop.is_set():
            stub.Infer(request, timeout=20)
            done += 1
        return done

    compute: list[float] = []
    device: list[float] = []
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        try:
            end = time.monotonic() + 20.0
            last = role_seconds(server.metrics_text())
            while time.monotonic() < end and len(compute) < 6:
                time.sleep(0.3)
                now = role_seconds(server.metrics_text())
                roles = {r: now[r] - last.get(r, 0.0) for r in now}  # CPU seconds since the last scrape
                assert all(v >= 0 for v in roles.values()), roles  # counters never fall
                last = now
                if roles.get("device", 0.0) > 0:  # a sample taken under load
                    compute.append(roles.get("compute", 0.0))
                    device.append(roles.get("device", 0.0))
        finally:
            stop.set()
        served = sum(f.result(timeout=30) for f in futures)
    assert served > 0
    assert len(compute) >= 3, (compute, device)
    assert max(compute) > 0.0, (compute, device)
    # The worker runs its share of every forward pass: no longer a rounding error next to device.
    assert sum(compute) >= 0.25 * sum(device), (compute, device)


# -- bug 2: creation time ------------------------------------------------------------------------
@linux_only
def test_process_create_time_matches_child_start() -> None:
    """A fresh interpreter's creation time is at most a startup's length before its first statement."""
    # -S: site's .pth processing alone takes ~70 ms here, so it runs after the clock is read
    # (site.main() then makes psutil importable, as in a server).
    code = (
        "import time; t = time.time(); import site, sys; site.main(); "
        f"sys.path.insert(0, {str(REPO_ROOT)!r}); "
        "from server.coldstart import process_create_time; "
        "print(t, process_create_time())"
    )
    gaps = []
    for _ in range(3):  # the best of three: a loaded machine can slow one interpreter's start
        out = subprocess.run(
            [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=30, check=True
        )
        first_statement, created = map(float, out.stdout.split())
        gaps.append(first_statement - created)
    assert -0.005 <= min(gaps) < 0.05, gaps


@linux_only
def test_create_time_survives_a_process_name_that_is_not_utf8() -> None:
    """The command name in /proc/self/stat is raw bytes; one that is not UTF-8 must not send the
    reading to psutil's whole-second fallback."""
    code = (
        "import ctypes; ctypes.CDLL(None).prctl(15, b'\\xff\\xfe a) b', 0, 0, 0); "
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
        "from server.coldstart import _linux_create_time; print(_linux_create_time())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() != "None" and float(out.stdout) > 0


@pytest.mark.slow
@linux_only
def test_cold_start_within_outside_wall_time(start_server: ServerLauncher) -> None:
    """The reported cold start cannot exceed spawn → SERVING as seen from outside."""
    spawned = time.time()
    server = start_server(
        "--model", "conftest:SlowHandler", "--warmup-batches", "0", "--sample-interval-s", "5", wait=False
    )
    server.wait_ports()
    health = health_pb2_grpc.HealthStub(server.channel)
    # A watch hears the SERVING transition as it happens, with no polling delay to hide behind.
    stream = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
    try:
        for reply in stream:
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                break
    finally:
        stream.cancel()
    wall = time.time() - spawned
    info = InferenceStub(server.channel).ServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert [p.name for p in info.cold_start] == list(COLD_START_PHASES)
    total = info.cold_start[-1].at_s
    assert 0.0 <= total <= wall + 0.1, (total, wall)
    # Created after the test took its clock (10 ms start-tick resolution).
    assert info.start_unix_s >= spawned - 0.015, (info.start_unix_s, spawned)
    metrics = {
        s.labels["phase"]: s.value
        for fam in text_string_to_metric_families(server.metrics_text())
        if fam.name == "netgain_cold_start_seconds"
        for s in fam.samples
    }
    assert sum(metrics.values()) == pytest.approx(total, abs=1e-6)
