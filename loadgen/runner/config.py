"""What a load run is asked to do: ``netgain load``'s flags as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netgain.contract.rundir import DEFAULT_MAX_SEND_LAG_MS


@dataclass
class LoadConfig:
    targets: list[str]
    out: str
    workers: int = 1
    remote_workers: int = 0
    master_bind_host: str = "127.0.0.1"
    master_bind_port: int = 0
    mode: str = "open"
    concurrency: int = 0
    think_ms: float = 0.0
    warmup_s: float = 0.0
    duration_s: float = 10.0
    timeout_s: float = 10.0
    max_in_flight: int = 1000
    connections: int = 1
    seed: int = 0
    model: str | None = None
    metrics_port: int = -1
    web_ui: bool = False
    web_port: int = 8089
    max_send_lag_ms: float = DEFAULT_MAX_SEND_LAG_MS
    max_worker_cpu: float = 0.9
    slo_p99_ms: float | None = None
    max_error_rate: float | None = None
    price_per_hour: float | None = None
    wait_ready_s: float = 0.0
    refused_grace_s: float | None = None  # a refused connection fails after this (None: waited for)
    payload_variants: int = 8  # distinct payloads per size bucket
    tls_ca: str | None = None
    # "oip": the Open Inference Protocol (KServe v2 gRPC), any such server; "oip-http": its REST
    # form; "http-json": any JSON endpoint (request_template)
    protocol: str = "netgain"
    oip_model: str | None = None  # the OIP model name requests carry (default: --model)
    oip_binary: str = "auto"  # oip-http: the binary-data extension (auto | always | never)
    request_template: dict[str, Any] | None = None  # http-json: the --request-template, normalised
    probe: str = "all"  # "first": only the first target must be ready (scale-up drills)
    quiet: bool = False
    command: list[str] = field(default_factory=list)
