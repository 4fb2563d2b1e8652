"""What the server integration tests share: one gRPC call's reply with its trailers, the timing
checks every reply must pass, and Prometheus sample lookups."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from conftest import ServerHandle
from grpc_health.v1 import health_pb2
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from netgain.contract.phases import PHASES, parse_batch, parse_server_timing
from netgain.protos import InferenceStub, pb

CODE = grpc.StatusCode
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def png(color: tuple[int, int, int] = (200, 40, 40), size: tuple[int, int] = (24, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color=color).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Reply:
    code: grpc.StatusCode
    details: str
    trailers: dict[str, str]
    response: pb.InferResponse | None

    @property
    def timing(self) -> dict[str, float]:
        return parse_server_timing(self.trailers["server-timing"])

    @property
    def batch(self) -> tuple[int, int]:
        batch = parse_batch(self.trailers["server-timing"])
        assert batch is not None, self.trailers
        return batch


def infer(
    stub: InferenceStub,
    inputs: Iterable[pb.Input],
    request_id: str | None = None,
    model: str = "",
    timeout: float = 20.0,
) -> Reply:
    metadata = [("x-request-id", request_id)] if request_id is not None else []
    request = pb.InferRequest(model=model, inputs=list(inputs))
    try:
        resp, call = stub.Infer.with_call(request, metadata=metadata, timeout=timeout)
        return Reply(CODE.OK, "", {m.key: str(m.value) for m in call.trailing_metadata()}, resp)
    except grpc.RpcError as exc:
        err: Any = exc  # a grpc.Call as well as an RpcError
        trailers = {m.key: str(m.value) for m in (err.trailing_metadata() or ())}
        return Reply(err.code(), err.details() or "", trailers, None)


def concurrently(calls: list[Callable[[], Reply]], workers: int = 16) -> list[Reply]:
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result(timeout=60) for f in futures]


def assert_full_timing(reply: Reply, admitted: bool = True) -> None:
    """Every phase and total present. A request admitted to the queue has phases adding up to
    the total (within 2 % + rounding); one rejected at the door has zero phases and a small total."""
    timing = reply.timing
    assert list(timing) == [*PHASES, "total"], reply.trailers
    assert all(v >= 0 for v in timing.values())
    phase_sum = sum(timing[p] for p in PHASES)
    if admitted:
        assert timing["total"] > 0
        assert abs(phase_sum - timing["total"]) <= 0.02 * timing["total"] + 0.02, timing
    else:
        assert phase_sum == 0 and 0 < timing["total"] < 100, timing


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def samples(text: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def sample_value(handle: ServerHandle, name: str, **labels: str) -> float:
    total = 0.0
    for s in samples(handle.metrics_text()):
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total
