"""OpenTelemetry traces: W3C ``traceparent`` parsing, spans per request and batch, OTLP/HTTP export.

The event loop only stores the raw ``traceparent`` header on the request; the recorder thread
validates it and builds the spans (``TraceBuilder``) from the request's phase durations, and a
thread of its own (``OtlpExporter``) posts them as ``ExportTraceServiceRequest`` protobuf bodies
to ``<endpoint>/v1/traces``. The exporter's queue is bounded: spans that do not fit, or whose
export failed, are dropped and counted (``netgain_otlp_spans_dropped_total{reason}``); a failure
is logged once and never reaches a request.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from netgain.contract.phases import PHASES
from netgain.server.batching.queue import Pending
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")

_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# OTLP enum values (opentelemetry/proto/trace/v1/trace.proto).
SPAN_KIND_INTERNAL = 1
SPAN_KIND_SERVER = 2
STATUS_CODE_OK = 1
STATUS_CODE_ERROR = 2
# W3C trace flags: bit 0 "sampled"; OTLP span flags carry them in their low 8 bits.
_SAMPLED = 1


def parse_traceparent(value: str) -> tuple[bytes, bytes, int] | None:
    """``version-traceid-parentid-flags`` (W3C Trace Context level 1) → (trace id, parent span id,
    flags), or None when malformed: version ``ff``, upper-case or non-hex digits, an all-zero id,
    or version ``00`` with anything after the flags. A later version may append fields."""
    if len(value) < 55 or (len(value) > 55 and value[55] != "-"):
        return None
    version, trace_id, parent_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if not _HEX.issuperset(version + trace_id + parent_id + flags) or version == "ff":
        return None
    if version == "00" and len(value) != 55:
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return bytes.fromhex(trace_id), bytes.fromhex(parent_id), int(flags, 16)


def _attrs(pb: Any, values: dict[str, str | int]) -> list[Any]:
    out = []
    for key, v in values.items():
        if isinstance(v, str):
            out.append(pb.KeyValue(key=key, value=pb.AnyValue(string_value=v)))
        else:
            out.append(pb.KeyValue(key=key, value=pb.AnyValue(int_value=v)))
    return out


_GRPC_CODES = {c.name: int(c.value[0]) for c in grpc.StatusCode}


def _grpc_code(name: str) -> int:
    return _GRPC_CODES.get(name, _GRPC_CODES["UNKNOWN"])


class TraceBuilder:
    """On the recorder thread: trace context per request and the spans of requests and batches.

    A request's context (trace id, its span id, the client's parent span id or b"") is assigned
    once and kept on the request (``Pending.trace``), so its batch span's link, its request span
    and its exemplar all name the same ids whichever is built first."""

    def __init__(self, model: str, device: str, pid: int, wall_offset_ns: int = 0) -> None:
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        self._common = common_pb2
        self._trace = trace_pb2
        self.model = model
        self.device = device
        self.pid = pid
        self.wall_offset_ns = wall_offset_ns  # perf_counter_ns → unix ns (the Recorder sets its own)
        self._rand = random.Random(os.urandom(16))
        self._constant = _attrs(
            common_pb2, {"netgain.model": model, "netgain.device": device, "process.pid": pid}
        )

    def _id(self, n: int) -> bytes:
        while True:
            b = self._rand.getrandbits(8 * n).to_bytes(n, "big")
            if any(b):
                return b

    def context(self, p: Pending) -> tuple[bytes, bytes, bytes]:
        if p.trace is None:
            parsed = parse_traceparent(p.traceparent) if p.traceparent else None
            if parsed is None:
                p.trace = (self._id(16), self._id(8), b"")
            else:
                p.trace = (parsed[0], self._id(8), parsed[1])
        return p.trace

    def request_spans(self, p: Pending, total_ns: int) -> list[Any]:
        """``netgain.request`` (SERVER; the client's span as parent when it sent a traceparent)
        and one child per phase the request went through, laid end to end from its arrival."""
        tpb = self._trace
        trace_id, span_id, parent = self.context(p)
        start = p.arrival_ns + self.wall_offset_ns
        attrs: dict[str, str | int] = {
            "netgain.request_id": p.request_id,
            "netgain.batch.id": p.batch_id,
            "netgain.batch.size": p.batch_size,
            "netgain.items": p.n_items,
            "netgain.code": p.code,
            "rpc.grpc.status_code": _grpc_code(p.code),
        }
        status = (
            tpb.Status(code=STATUS_CODE_ERROR, message=p.message)
            if p.code != "OK"
            else tpb.Status(code=STATUS_CODE_OK)
        )
        spans = [
            tpb.Span(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=parent,
                flags=_SAMPLED | 0x100,  # 0x100: the span's context flags are known
                name="netgain.request",
                kind=SPAN_KIND_SERVER,
                start_time_unix_nano=start,
                end_time_unix_nano=start + total_ns,
                attributes=[*_attrs(self._common, attrs), *self._constant],
                status=status,
            )
        ]
        cursor = start  # phase spans carry no attributes: their parent has them (cheaper to build)
        for phase in PHASES:
            if phase not in p.spans:
                continue
            dur = p.spans[phase]
            spans.append(
                tpb.Span(
                    trace_id=trace_id,
                    span_id=self._id(8),
                    parent_span_id=span_id,
                    flags=_SAMPLED | 0x100,
                    name=phase,
                    kind=SPAN_KIND_INTERNAL,
                    start_time_unix_nano=cursor,
                    end_time_unix_nano=cursor + dur,
                )
            )
            cursor += dur
        return spans

    def batch_span(self, requests: Sequence[Pending], size: int, kernel_ns: int, end_perf_ns: int) -> Any:
        """``netgain.batch``: a trace of its own linked to each request span of the batch; it ends
        when post-processing began and lasts the batch's pre, h2d, kernel and d2h laid end to end."""
        tpb = self._trace
        first = requests[0] if requests else None
        work = sum(first.spans.get(ph, 0) for ph in ("pre", "h2d", "kernel", "d2h")) if first else 0
        end = end_perf_ns + self.wall_offset_ns
        links = []
        for p in requests:
            trace_id, span_id, _ = self.context(p)
            links.append(tpb.Span.Link(trace_id=trace_id, span_id=span_id, flags=_SAMPLED | 0x100))
        attrs: dict[str, str | int] = {
            "netgain.batch.id": first.batch_id if first else -1,
            "netgain.batch.size": size,
            "netgain.batch.requests": len(requests),
            "netgain.kernel_ns": kernel_ns,
        }
        return tpb.Span(
            trace_id=self._id(16),
            span_id=self._id(8),
            flags=_SAMPLED | 0x100,
            name="netgain.batch",
            kind=SPAN_KIND_INTERNAL,
            start_time_unix_nano=end - work,
            end_time_unix_nano=end,
            attributes=[*_attrs(self._common, attrs), *self._constant],
            links=links,
        )


class OtlpExporter:
    """A thread posting spans to ``endpoint`` (``http://host:4318``; ``/v1/traces`` is appended
    unless the URL already ends with it) every ``interval_s`` or once ``batch_spans`` are queued.
    ``submit`` never blocks: past ``max_queue_spans`` spans are dropped and counted."""

    def __init__(
        self,
        endpoint: str,
        resource: dict[str, str | int],
        on_dropped: Callable[[str, int], None] | None = None,
        on_exported: Callable[[int], None] | None = None,
        max_queue_spans: int = 16384,
        batch_spans: int = 2048,
        interval_s: float = 1.0,
        timeout_s: float = 5.0,
    ) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        self._svc = trace_service_pb2
        self._trace = trace_pb2
        self.url = endpoint.rstrip("/")
        if not self.url.endswith("/v1/traces"):
            self.url += "/v1/traces"
        self._resource = resource_pb2.Resource(attributes=_attrs(common_pb2, resource))
        self._scope = common_pb2.InstrumentationScope(name="netgain.server")
        self.on_dropped = on_dropped
        self.on_exported = on_exported
        self.max_queue_spans = max_queue_spans
        self.batch_spans = batch_spans
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._failing = False
        self.exported = 0
        self.dropped: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, name="netgain-otlp", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, spans: list[Any]) -> None:
        if not spans:
            return
        with self._cond:
            room = self.max_queue_spans - len(self._queue)
            take = spans if len(spans) <= room else spans[: max(0, room)]
            self._queue.extend(take)
            if len(self._queue) >= self.batch_spans:
                self._cond.notify()
        if len(take) < len(spans):
            self._drop("queue_full", len(spans) - len(take))

    def _drop(self, reason: str, n: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n
        if self.on_dropped is not None:
            self.on_dropped(reason, n)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        name_os_thread()
        while True:
            with self._cond:
                if not self._stop and len(self._queue) < self.batch_spans:
                    self._cond.wait(self.interval_s)
                stopping = self._stop
                n = min(len(self._queue), self.batch_spans)
                spans = [self._queue.popleft() for _ in range(n)]
            if spans:
                try:
                    self._post(spans)
                except Exception:
                    log.exception("OTLP exporter failed; continuing")
            with self._cond:
                if stopping and not self._queue:
                    return

    def _post(self, spans: list[Any]) -> None:
        body = self._svc.ExportTraceServiceRequest(
            resource_spans=[
                self._trace.ResourceSpans(
                    resource=self._resource,
                    scope_spans=[self._trace.ScopeSpans(scope=self._scope, spans=spans)],
                )
            ]
        ).SerializeToString()
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
        except (OSError, urllib.error.HTTPError, ValueError) as exc:
            self._drop("export_failed", len(spans))
            if not self._failing:
                self._failing = True
                log.warning(
                    "OTLP export to %s failed (%s); dropping spans while it fails (counted in "
                    "netgain_otlp_spans_dropped_total), logged once until it recovers",
                    self.url,
                    exc,
                )
            return
        if self._failing:
            self._failing = False
            log.warning("OTLP export to %s recovered", self.url)
        self.exported += len(spans)
        if self.on_exported is not None:
            self.on_exported(len(spans))


def otlp_available() -> str | None:
    """None when opentelemetry-proto imports, else the reason."""
    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
    except ImportError as exc:
        return f"--otlp-endpoint needs opentelemetry-proto (pip install 'netgain[serve]'): {exc}"
    return None


def build_tracing(
    endpoint: str | None, metrics: Any, model: str, device: str
) -> tuple[TraceBuilder | None, OtlpExporter | None]:
    """The recorder's tracer and exporter for ``--otlp-endpoint`` (both None without one); the
    exporter counts into ``metrics`` (a ServerMetrics, or None without instrumentation)."""
    if not endpoint:
        return None, None
    why = otlp_available()
    if why is not None:
        raise RuntimeError(why)
    device = device.split(":")[0]
    pid = os.getpid()
    on_dropped = on_exported = None
    if metrics is not None:
        dropped, exported = metrics.otlp_spans_dropped, metrics.otlp_spans_exported
        labels = metrics.labels
        exported_child = exported.labels(**labels)
        on_exported = exported_child.inc

        def on_dropped(reason: str, n: int) -> None:
            dropped.labels(**labels, reason=reason).inc(n)

    resource: dict[str, str | int] = {
        "service.name": "netgain",
        "service.instance.id": f"{os.uname().nodename}-{pid}",
        "process.pid": pid,
        "netgain.model": model,
        "netgain.device": device,
    }
    exporter = OtlpExporter(endpoint, resource, on_dropped=on_dropped, on_exported=on_exported)
    return TraceBuilder(model, device, pid), exporter
