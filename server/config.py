"""Server configuration (what ``netgain serve`` flags become)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netgain.server import eventloop


@dataclass
class ServeConfig:
    model: str = "image"
    device: str = "cpu"
    dtype: str = "float32"
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9464  # 0: any free port; -1: no metrics endpoint
    http_port: int = -1  # KServe v2 REST beside gRPC; 0: any free port; -1: off
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 256
    instances: int = 1
    pre_threads: int = 2
    workers: int | str = "auto"  # frontend processes; 0: one process; "auto": from the usable cores
    pre_processes: int | str = "auto"  # processes that only pre-process; 0: the frontends' threads do
    slots_per_worker: int = 0  # hand-off slots per frontend; 0: sized from max_batch_size
    intra_op_threads: int = 0  # 0: every core this process may use
    max_message_bytes: int = 16 * 1024 * 1024
    max_items_per_request: int = 256
    span_log: str | None = None
    span_log_max_bytes: int = 0
    warmup_batches: int = 3
    handler_options: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    profile_dir: str | None = None
    nvtx: bool = False
    cuda_graphs: bool = False
    instrumentation: bool = True
    sample_interval_s: float = 1.0
    recorder_interval_s: float = 0.05
    ports_file: str | None = None
    otlp_endpoint: str | None = None  # OTLP/HTTP receiver (http://host:4318): spans per request
    grace_s: float = 30.0
    receive_timeout_s: float = 30.0  # a unary request's message must arrive within this
    switch_interval_ms: float = 1.0
    event_loop: str = "auto"  # auto: uvloop where installed, else asyncio's
    worker_nice: int = 0  # added to the frontends' and pre-processing processes' niceness
    device_cores: int | str = "auto"  # cores the device process runs on alone; 0: every process floats
    pin_pre_processes: bool = False  # each pre-processing process on one core of its own, in turn

    def validate(self) -> None:
        """Raise ValueError naming the flag and a fix."""
        checks = [
            (self.max_batch_size >= 1, "--max-batch-size must be at least 1"),
            (self.max_queue_delay_ms >= 0, "--max-queue-delay-ms must be >= 0"),
            (self.max_queue_size >= 1, "--max-queue-size must be at least 1"),
            (self.instances >= 1, "--instances must be at least 1"),
            (self.pre_threads >= 1, "--pre-threads must be at least 1"),
            (self.intra_op_threads >= 0, "--intra-op-threads must be >= 0 (0 = all cores)"),
            (self.max_message_bytes >= 1024, "--max-message-mb must be at least 0.001 (1 KiB)"),
            (self.max_items_per_request >= 1, "--max-items-per-request must be at least 1"),
            (0 <= self.port <= 65535, "--port must be in 0..65535"),
            (-1 <= self.metrics_port <= 65535, "--metrics-port must be in -1..65535 (-1 disables)"),
            (-1 <= self.http_port <= 65535, "--http-port must be in -1..65535 (-1 disables)"),
            (
                self.http_port <= 0 or self.http_port not in (self.port, self.metrics_port),
                f"--http-port {self.http_port} is taken by --port or --metrics-port: choose another",
            ),
            (bool(self.tls_cert) == bool(self.tls_key), "--tls-cert and --tls-key go together"),
            (not self.tls_client_ca or bool(self.tls_cert), "--tls-client-ca needs --tls-cert and --tls-key"),
            (self.sample_interval_s > 0, "--sample-interval-s must be > 0"),
            (self.recorder_interval_s > 0, "--recorder-interval-s must be > 0"),
            (self.switch_interval_ms > 0, "--switch-interval-ms must be > 0"),
            (self.receive_timeout_s > 0, "--receive-timeout-s must be > 0"),
            (0 <= self.worker_nice <= 19, "--worker-nice must be in 0..19"),
            (
                not self.otlp_endpoint or self.otlp_endpoint.startswith(("http://", "https://")),
                "--otlp-endpoint must be an http:// or https:// URL (an OTLP/HTTP receiver, port 4318)",
            ),
        ]
        self.workers = workers = _count_or_auto(self.workers, "--workers")
        self.pre_processes = pre = _count_or_auto(self.pre_processes, "--pre-processes")
        self.device_cores = kept = _count_or_auto(self.device_cores, "--device-cores")
        checks += [
            (workers == "auto" or 0 <= int(workers) <= 256, "--workers must be 0..256 or auto"),
            (pre == "auto" or 0 <= int(pre) <= 256, "--pre-processes must be 0..256 or auto"),
            (kept == "auto" or 0 <= int(kept) <= 256, "--device-cores must be 0..256 or auto"),
            (pre in ("auto", 0) or workers != 0, "--pre-processes needs --workers above 0"),
            (
                not self.pin_pre_processes or (workers != 0 and pre != 0),
                "--pin-pre-processes needs pre-processing processes: --workers and --pre-processes "
                "above 0 (or auto)",
            ),
            (self.slots_per_worker >= 0, "--slots-per-worker must be >= 0 (0 = from the batch size)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        eventloop.loop_factory(self.event_loop)  # an unknown loop, or uvloop asked for and missing

    def resolved_workers(self, cores: int, device: str) -> int:
        """Frontend processes for ``--workers auto``: none (one process) below 4 usable cores or with
        --profile-dir; on a GPU one per core beyond the two the device process and the supervisor
        use, at most 16; on the CPU two, leaving the other cores to model compute."""
        if isinstance(self.workers, int):
            return self.workers
        if self.profile_dir or cores < 4:  # the Profile RPC captures the one-process server's device thread
            return 0
        if not device.startswith("cuda"):  # the forward, not pre-processing, takes a CPU run's cores
            return 2
        kept = self.device_cores if isinstance(self.device_cores, int) else 0
        return min(16, cores - max(2, kept + 1))

    def resolved_device_cores(self, cores: int, device: str, item_bytes: int) -> int:
        """Cores the device process runs on alone for ``--device-cores auto``: one on a GPU host of 8
        usable cores or more when the pre-processed items are small (``SMALL_ITEM_BYTES``): its work
        is then Python under one GIL, whose threads hand it over faster on one core than across
        several; none when items are large, whose copies need several cores (docs/server.md)."""
        if isinstance(self.device_cores, int):
            return self.device_cores
        if not device.startswith("cuda") or cores < 8:
            return 0
        return 1 if item_bytes <= SMALL_ITEM_BYTES else 0

    def resolved_split(self, cores: int, device: str, pre_ms: float, kept: int = 0) -> tuple[int, int]:
        """(frontends, pre-processing processes) for a server of several processes. On a GPU with
        both left at auto, one process per core (at most 16), split in proportion to the CPU each
        side spends per request: ``pre_ms`` (the handler's pre-processing, timed at start-up)
        against ``FRONTEND_MS`` (gRPC, hand-off and post); the device process shares the cores
        but for the ``kept`` cores it runs on alone.
        On the CPU the forward takes the cores: no pre-processing processes unless asked for."""
        workers = self.resolved_workers(cores, device)
        if isinstance(self.pre_processes, int):
            if self.pre_processes and not workers:
                raise ValueError(
                    f"--pre-processes needs frontend processes: with {cores} usable cores --workers auto "
                    "runs one process; pass --workers 1 or more"
                )
            return workers, self.pre_processes
        if workers == 0 or not device.startswith("cuda"):
            return workers, 0
        budget = max(2, min(16, cores - kept))
        if isinstance(self.workers, int):
            return workers, max(0, budget - workers)
        # Rounded up: a saturated frontend queues requests before any phase is measured.
        front = math.ceil(budget * FRONTEND_MS / (FRONTEND_MS + max(0.0, pre_ms)))
        front = max(1, min(budget - 1, front))
        return front, budget - front


# A frontend's CPU per request (gRPC, the servicer, the hand-off, post), on the scale of pre_ms as
# timed at start-up (one item, idle cores): used only to size --pre-processes auto (docs/server.md).
FRONTEND_MS = 0.4
# Pre-processed items up to this size leave the device process only Python work (token ids, rows).
SMALL_ITEM_BYTES = 16 * 1024


def core_sets(usable: set[int], device_cores: int) -> tuple[list[int], list[int]]:
    """(the device process's cores, everyone else's) for ``--device-cores``: the device process runs
    alone on the highest-numbered usable cores, the others on the rest; with 0 both are every
    usable core."""
    ordered = sorted(usable)
    if not device_cores:
        return ordered, ordered
    if device_cores >= len(ordered):
        raise ValueError(
            f"--device-cores {device_cores} leaves no core for the frontends: "
            f"{len(ordered)} usable core(s); use at most {len(ordered) - 1}"
        )
    return ordered[-device_cores:], ordered[:-device_cores]


def _count_or_auto(value: int | str, flag: str) -> int | str:
    if isinstance(value, int) or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{flag} {value!r}: use a whole number >= 0 or auto") from None
