"""The engine's gRPC sender (``--protocol netgain`` and ``oip``): grpc.aio channels, pre-serialized
request bytes to one method, the ``server-timing`` trailer read from each answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import numpy as np

from netgain.contract.messages import Plan
from netgain.contract.phases import REQUEST_ID_KEY, TIMING_KEY
from netgain.loadgen.payloads import PayloadFactory
from netgain.loadgen.runner.sender import NO_ANSWER, Outcome, one_line, server_columns

# Reconnect within ~0.5 s of a restarted server: gRPC's default backoff (1 s, x1.6, up to 120 s)
# keeps failing requests long after the server is back (tests/test_reliability_faults.py).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
# A dns:/// target (a headless Service) resolves to every ready pod; round_robin spreads each
# channel's requests over all of them (gRPC's default, pick_first, sends everything to one).
ROUND_ROBIN = ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]}))


def channel_options(target: str, connections: int) -> list[tuple[str, Any]]:
    """Options of each of a target's ``connections`` channels: reconnect backoff; a local
    subchannel pool when there are several (gRPC otherwise shares one connection among channels
    with the same target and options); round_robin over the resolved addresses for a ``dns:``
    target. A plain HOST:PORT keeps pick_first, so its ``--connections`` are unchanged."""
    opts: list[tuple[str, Any]] = list(CHANNEL_OPTIONS)
    if connections > 1:
        opts.append(("grpc.use_local_subchannel_pool", 1))
    if target.startswith("dns:"):
        opts.append(ROUND_ROBIN)
    return opts


def parse_trailers(md: Any) -> dict[str, Any]:
    """Server phases, total and batch from trailing metadata; missing values are None.
    Runs once per response in the sender process."""
    for key, value in md or ():
        if key == TIMING_KEY:
            return server_columns(value)
    return dict(NO_ANSWER)


class GrpcSender:
    """``connections`` channels per target; request ``idx`` goes to channel
    ``(idx // targets) % connections`` of its target."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.payloads = PayloadFactory(
            plan.model, plan.handler_options, plan.seed, variants=int(plan.extra.get("payload_variants", 8))
        )
        self.channels: list[list[grpc.aio.Channel]] = []
        # Per target, per channel: the method's callable (bytes in, bytes out: requests are
        # pre-serialized and responses only measured).
        self.calls: list[list[Any]] = []
        self._calls: set[Any] = set()  # calls in flight, cancelled when a stop's drain runs out
        self.cancelled = False

    def build(self, index: np.ndarray, size: np.ndarray, items: np.ndarray) -> list[bytes]:
        return [
            self.payloads.request_bytes(int(i), int(s), int(k))
            for i, s, k in zip(index, size, items, strict=True)
        ]

    def size(self, message: bytes) -> int:
        return len(message)

    async def open(self) -> None:
        """``connections`` channels per target (options: ``channel_options``). With round_robin
        (a ``dns:`` target) each channel connects to every resolved address: N per pod."""
        n = max(1, self.plan.connections)
        creds = None
        if self.plan.tls_ca:
            with open(self.plan.tls_ca, "rb") as fh:
                creds = grpc.ssl_channel_credentials(fh.read())
        for t in self.plan.targets:
            opts = channel_options(t, n)
            self.channels.append(
                [
                    grpc.aio.secure_channel(t, creds, opts) if creds else grpc.aio.insecure_channel(t, opts)
                    for _ in range(n)
                ]
            )
        method = self.payloads.method
        self.calls = [[ch.unary_unary(method, None, None) for ch in per] for per in self.channels]

    def start(self, message: bytes, idx: int, target: int) -> Any:
        conns = self.calls[target]
        call = conns[(idx // len(self.calls)) % len(conns)](
            message,
            metadata=((REQUEST_ID_KEY, f"{self.plan.run_id}-{idx}"),),
            timeout=self.plan.timeout_s,
        )
        self._calls.add(call)
        return call

    async def finish(self, call: Any) -> Outcome:
        try:
            raw = await call
            md: Any = await call.trailing_metadata()
            outcome: Outcome = ("OK", len(raw), parse_trailers(md))
        except grpc.aio.AioRpcError as exc:
            server = parse_trailers(exc.trailing_metadata())
            server["error"] = one_line(str(exc.details() or exc.code().name))
            outcome = (exc.code().name, 0, server)
        except asyncio.CancelledError:
            if not (self.cancelled and call.cancelled()):
                raise
            outcome = ("CANCELLED", 0, {**NO_ANSWER, "error": "cancelled after the stop's drain"})
        self._calls.discard(call)
        return outcome

    def cancel(self) -> None:
        self.cancelled = True
        for call in list(self._calls):
            call.cancel()

    async def close(self) -> None:
        for per in self.channels:
            for ch in per:
                await ch.close(None)
