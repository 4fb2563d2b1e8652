"""The messages of a load run, by name: master ↔ workers over Locust's ZeroMQ/msgpack channel,
and the same kinds between a worker and its sender engine over a pipe (``loadgen.runner.frames``);
and the plan, the body of ``PLAN``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

HELLO = "netgain_hello"  # worker → master: its handlers are registered, a plan will not be lost
PLAN = "netgain_plan"  # master → worker → engine: the worker's shard and settings
READY = "netgain_ready"  # engine → worker → master: payloads built, waiting for the epoch
CHUNK = "netgain_chunk"  # master → worker → engine: the next part of its shard (open loop; ``more``)
GO = "netgain_go"  # master → workers → engines: the common epoch (unix ns)
RECORDS = "netgain_records"  # engine → worker → master: a batch of finished request records
DONE = "netgain_done"  # engine → worker → master: every request of the shard has its record
STOP = "netgain_stop"  # master → workers → engines: interrupted; send no more, drain what is in flight
SURPLUS = "netgain_surplus"  # master → worker: every worker the run expects is here; this one exits


@dataclass
class Plan:
    run_id: str
    worker: int
    workers: int
    targets: list[str]
    model: str
    handler_options: dict[str, str]
    seed: int
    mode: str  # "open" or "closed"
    warmup_ns: int
    timeout_s: float
    max_in_flight: int
    # open loop: this worker's shard of the schedule
    index: bytes = b""
    t_ns: bytes = b""
    size: bytes = b""
    items: bytes = b""
    # closed loop
    concurrency: int = 0
    think_ms: float = 0.0
    duration_ns: int = 0
    tls_ca: str | None = None
    connections: int = 1  # per target
    more: bool = False  # open loop: further parts of the shard follow as CHUNK messages
    protocol: str = "netgain"  # netgain | oip (gRPC) | oip-http | http-json
    # HTTP protocols: the request's form (http-json: the --request-template; oip-http: "binary")
    http: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_msg(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_msg(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.frombuffer(self.index, dtype=np.int64),
            np.frombuffer(self.t_ns, dtype=np.int64),
            np.frombuffer(self.size, dtype=np.int64),
            np.frombuffer(self.items, dtype=np.int32),
        )
