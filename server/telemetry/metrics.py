"""Prometheus metrics of the server, on a registry passed in (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from netgain.contract.phases import PHASES
from netgain.server.telemetry.histograms import DurationHistograms
from netgain.stats.histogram import DURATION_BUCKETS, log_buckets

BATCH_BUCKETS = tuple(float(2**i) for i in range(11))  # 1 .. 1024 items


class ServerMetrics:
    """Every ``netgain_*`` metric the server exports, and the standard ``process_*`` ones
    (prometheus_client's ProcessCollector). GPU gauges exist only when a GPU is sampled.

    Prometheus conventions: what accumulates is a counter (``*_total``; CPU and kernel time in
    seconds), and a ratio that ``rate()`` derives from one is not exported beside it
    (``rate(process_cpu_seconds_total[1m])`` is the process's cores in use,
    ``rate(netgain_kernel_busy_seconds_total[1m]) / netgain_device_instances`` the kernel busy
    ratio per instance)."""

    def __init__(self, registry: CollectorRegistry, model: str, device: str) -> None:
        self.registry = registry
        self.labels = {"model": model, "device": device.split(":")[0]}
        lab = ("model", "device")
        self.durations = DurationHistograms(self.labels, DURATION_BUCKETS)
        registry.register(self.durations)
        self.batch_size = Histogram(
            "netgain_batch_size_items",
            "Items per device batch.",
            lab,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "netgain_requests",
            "Requests answered, by gRPC status code.",
            (*lab, "code"),
            registry=registry,
        )
        self.batches = Counter("netgain_batches", "Device batches run.", lab, registry=registry)
        self.kernel_seconds = Counter(
            "netgain_kernel_busy_seconds",
            "Sum of kernel spans (device busy time from our own events).",
            lab,
            registry=registry,
        )
        self.instances = Gauge(
            "netgain_device_instances",
            "Model instances running batches (the kernel busy ratio is per instance).",
            lab,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "netgain_queue_depth_requests", "Requests waiting to be batched.", lab, registry=registry
        )
        self.in_flight = Gauge(
            "netgain_in_flight_requests", "Requests accepted and not yet answered.", lab, registry=registry
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, ... (Linux /proc).
        ProcessCollector(registry=registry)
        self.thread_cpu = Counter(
            "netgain_thread_cpu_seconds",
            "CPU time used by thread role, as the sampler last read it (1 s/s = one core).",
            (*lab, "role"),
            registry=registry,
        )
        self.otlp_spans_exported = Counter(
            "netgain_otlp_spans_exported",
            "Spans accepted by the OTLP receiver (--otlp-endpoint).",
            lab,
            registry=registry,
        )
        self.otlp_spans_dropped = Counter(
            "netgain_otlp_spans_dropped",
            "Spans not exported: reason queue_full (the exporter's bounded queue) or export_failed.",
            (*lab, "reason"),
            registry=registry,
        )
        self.cpu_cores = Gauge(
            "netgain_cpu_cores", "CPU cores this process may run on.", lab, registry=registry
        )
        self.cold_start = Gauge(
            "netgain_cold_start_seconds",
            "Duration of each cold-start phase.",
            (*lab, "phase"),
            registry=registry,
        )
        self.ready = Gauge(
            "netgain_ready", "1 once the model is loaded and warmed up.", lab, registry=registry
        )
        self.info = Info(
            "netgain_server",
            "The server's configuration (exported as netgain_server_info, value 1).",
            lab,
            registry=registry,
        )
        self.gpu: GpuGauges | None = None
        # Labelled children resolved once: .labels() costs about as much as an observation.
        self.batch_child = self.batch_size.labels(**self.labels)
        self.batches_child = self.batches.labels(**self.labels)
        self.kernel_child = self.kernel_seconds.labels(**self.labels)
        self._code_children: dict[str, Counter] = {}

    def enable_gpu(self) -> GpuGauges:
        if self.gpu is None:
            self.gpu = GpuGauges(self.registry, self.labels)
        return self.gpu

    def requests_with(self, code: str) -> Counter:
        child = self._code_children.get(code)
        if child is None:
            child = self._code_children[code] = self.requests.labels(**self.labels, code=code)
        return child


class GpuGauges:
    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        lab = (*labels, "gpu")
        self.utilization = Gauge(
            "netgain_gpu_utilization_ratio",
            "NVML utilization.gpu: share of time any kernel ran.",
            lab,
            registry=registry,
        )
        self.sm_active = Gauge(
            "netgain_gpu_sm_active_ratio",
            "GPM SM activity: share of SM cycles busy (finer than utilization).",
            lab,
            registry=registry,
        )
        self.memory_used = Gauge(
            "netgain_gpu_memory_used_bytes", "GPU memory in use.", lab, registry=registry
        )
        self.memory_total = Gauge(
            "netgain_gpu_memory_total_bytes", "GPU memory in all.", lab, registry=registry
        )
        self.power = Gauge("netgain_gpu_power_watts", "GPU power draw.", lab, registry=registry)


__all__ = ["BATCH_BUCKETS", "DURATION_BUCKETS", "PHASES", "ServerMetrics", "log_buckets"]
