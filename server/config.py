"""Server configuration (what ``netgain serve`` flags become)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeConfig:
    model: str = "image"
    device: str = "cpu"
    dtype: str = "float32"
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9464  # 0: any free port; -1: no metrics endpoint
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 256
    instances: int = 1
    pre_threads: int = 2
    workers: int | str = "auto"  # frontend processes; 0: one process; "auto": from the usable cores
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
    switch_interval_ms: float = 1.0

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
            (bool(self.tls_cert) == bool(self.tls_key), "--tls-cert and --tls-key go together"),
            (not self.tls_client_ca or bool(self.tls_cert), "--tls-client-ca needs --tls-cert and --tls-key"),
            (self.sample_interval_s > 0, "--sample-interval-s must be > 0"),
            (self.recorder_interval_s > 0, "--recorder-interval-s must be > 0"),
            (self.switch_interval_ms > 0, "--switch-interval-ms must be > 0"),
            (
                not self.otlp_endpoint or self.otlp_endpoint.startswith(("http://", "https://")),
                "--otlp-endpoint must be an http:// or https:// URL (an OTLP/HTTP receiver, port 4318)",
            ),
        ]
        workers = self.workers
        if isinstance(workers, str) and workers != "auto":
            try:
                self.workers = workers = int(workers)
            except ValueError:
                raise ValueError(f"--workers {workers!r}: use a whole number >= 0 or auto") from None
        checks += [
            (
                workers == "auto" or (isinstance(workers, int) and 0 <= workers <= 256),
                "--workers must be 0..256 or auto",
            ),
            (self.slots_per_worker >= 0, "--slots-per-worker must be >= 0 (0 = from the batch size)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

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
        return min(16, cores - 2)
