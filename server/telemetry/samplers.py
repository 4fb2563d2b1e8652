"""Periodic samplers: per-thread-role CPU (counters of seconds), GPU (NVML, GPM gauges).

Process CPU and memory are prometheus_client's ProcessCollector (``process_*``), read at scrape
time; the kernel busy ratio is ``rate(netgain_kernel_busy_seconds_total)`` over
``netgain_device_instances``. The samplers run on their own thread and only write metrics; a
sampler that fails logs once and keeps going. With no GPU, or no NVML, the GPU gauges are never created, so
they are absent from /metrics rather than reading zero.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from netgain.server.procstat import CLK_TCK, STARTTIME, STIME, UTIME, stat_fields
from netgain.server.telemetry.metrics import ServerMetrics
from netgain.server.threadnames import name_os_thread, own_threads

log = logging.getLogger("netgain.server")


# OS names of the server's own threads (server.threadnames); the netgain- forms are their Python names.
_OWN_ROLES = (
    ("ng-prepost", "prepost"),
    ("ng-device", "device"),
    ("ng-batcher", "batcher"),
    ("ng-recorder", "telemetry"),
    ("ng-sampler", "telemetry"),
    ("ng-otlp", "telemetry"),
    ("ng-metrics", "telemetry"),
    ("netgain-prepost", "prepost"),
    ("netgain-device", "device"),
    ("netgain-batcher", "batcher"),
    ("netgain-recorder", "telemetry"),
    ("netgain-sampler", "telemetry"),
    ("netgain-otlp", "telemetry"),
    ("netgain-metrics", "telemetry"),
)
_OTHER_ROLES = (
    ("grpc", "grpc"),
    ("default-exec", "grpc"),
    ("resolver", "grpc"),
    ("event_engine", "grpc"),
    ("pt_", "compute"),
)
_OWN_PREFIXES = tuple(prefix for prefix, _ in _OWN_ROLES)


def thread_role(name: str, tid: int, pid: int, own: Mapping[int, str] | None = None) -> str:
    """Map a thread (its name from /proc/self/task/TID/comm, its id) to a role.

    ``own`` maps the native ids of the server's own named threads to their names. When given,
    a thread is classified by id first: one that carries one of our names without being one of
    ours inherited it from the thread that started it (torch's OpenMP workers copy the device
    thread's name), and counts as ``compute``. Without it, the name alone decides.
    """
    if tid == pid:
        return "frontend"  # main thread: asyncio loop and the gRPC Python handlers
    if own is not None:
        if tid in own:
            name = own[tid]
        elif name.startswith(_OWN_PREFIXES):
            return "compute"
    for prefix, role in (*_OWN_ROLES, *_OTHER_ROLES):
        if name.startswith(prefix):
            return role
    return "compute"  # unnamed threads are mostly torch's intra-op (OpenMP) workers


def read_thread_cpu(pid: int | None = None) -> dict[str, float]:
    """CPU seconds used so far, summed by thread role (Linux /proc).

    In this process, the server's own threads are known by id (``own_threads``); another
    process's threads are classified by name only.
    """
    pid = pid or os.getpid()
    base = f"/proc/{pid}/task"
    entries = os.listdir(base)
    # After the listing: a thread that names itself in between is then already recorded.
    registered = own_threads() if pid == os.getpid() else None
    own: dict[int, str] | None = None if registered is None else {}  # confirmed as ours in this pass
    out: dict[str, float] = {}
    for entry in entries:
        try:
            with open(f"{base}/{entry}/comm") as fh:
                name = fh.read().strip()
            fields = stat_fields(f"{base}/{entry}/stat")
        except OSError:
            continue  # thread ended
        seconds = (int(fields[UTIME]) + int(fields[STIME])) / CLK_TCK
        tid = int(entry)
        mine = registered.get(tid) if registered is not None else None
        # The start time must match too: an id recorded for a thread that has ended may be reused.
        if own is not None and mine is not None and mine[1] in (None, int(fields[STARTTIME])):
            own[tid] = mine[0]
        role = thread_role(name, tid, pid, own)
        out[role] = out.get(role, 0.0) + seconds
    return out


class GpuSampler:
    """NVML readings for one GPU; SM activity from GPM where the GPU supports it (Hopper does)."""

    def __init__(self, index: int) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._gpm_prev: Any = None
        self.gpm = False
        try:
            self.gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception:
            self.gpm = False

    def read(self) -> dict[str, float]:
        n = self.nvml
        util = n.nvmlDeviceGetUtilizationRates(self.handle)
        mem = n.nvmlDeviceGetMemoryInfo(self.handle)
        out = {
            "utilization": util.gpu / 100.0,
            "memory_used": float(mem.used),
            "memory_total": float(mem.total),
            "power": n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
        }
        if self.gpm:
            sm = self._gpm_sm_active()
            if sm is not None:
                out["sm_active"] = sm
        return out

    def _gpm_sm_active(self) -> float | None:
        n = self.nvml
        sample = n.nvmlGpmSampleAlloc()
        n.nvmlGpmSampleGet(self.handle, sample)
        prev, self._gpm_prev = self._gpm_prev, sample
        if prev is None:
            return None
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 1
        req.sample1 = prev
        req.sample2 = sample
        req.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
        n.nvmlGpmMetricsGet(req)
        n.nvmlGpmSampleFree(prev)
        return float(req.metrics[0].value) / 100.0


class Sampler:
    def __init__(
        self,
        metrics: ServerMetrics,
        instances: int,
        gpu_index: int | None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.instances = instances  # 0 in a process that runs no model (a --workers frontend)
        self.interval_s = interval_s
        self.clock = clock
        self.gpu: GpuSampler | None = None
        if gpu_index is not None:
            try:
                self.gpu = GpuSampler(gpu_index)
                metrics.enable_gpu()
            except Exception as exc:
                log.warning("GPU metrics disabled: NVML unavailable (%s); install nvidia-ml-py", exc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netgain-sampler", daemon=True)
        self._warned: set[str] = set()

    def start(self) -> None:
        m = self.metrics
        m.cpu_cores.labels(**m.labels).set(len(os.sched_getaffinity(0)))
        if self.instances > 0:
            m.instances.labels(**m.labels).set(self.instances)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _loop(self) -> None:
        name_os_thread()
        m = self.metrics
        # Counters from zero: the first reading counts what each role used before (imports, model
        # build, warm-up); later ones add what it used since. A thread that ended takes its time
        # out of /proc, so a role's reading can fall: counted as no use, never as a decrease.
        last_roles: dict[str, float] = {}
        while True:
            try:
                roles = read_thread_cpu()
                for role in roles:
                    used = roles[role] - last_roles.get(role, 0.0)
                    if used > 0:
                        m.thread_cpu.labels(**m.labels, role=role).inc(used)
                last_roles = roles
            except Exception as exc:
                self._warn_once("cpu", exc)
            if self.gpu is not None and m.gpu is not None:
                try:
                    self._publish_gpu(self.gpu.read())
                except Exception as exc:
                    self._warn_once("gpu", exc)
            if self._stop.wait(self.interval_s):
                return

    def _publish_gpu(self, reading: dict[str, float]) -> None:
        g = self.metrics.gpu
        assert g is not None and self.gpu is not None
        lab = {**self.metrics.labels, "gpu": str(self.gpu.index)}
        g.utilization.labels(**lab).set(reading["utilization"])
        g.memory_used.labels(**lab).set(reading["memory_used"])
        g.memory_total.labels(**lab).set(reading["memory_total"])
        g.power.labels(**lab).set(reading["power"])
        if "sm_active" in reading:
            g.sm_active.labels(**lab).set(reading["sm_active"])

    def _warn_once(self, what: str, exc: Exception) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s sampler failed (%s); continuing without it", what, exc)
