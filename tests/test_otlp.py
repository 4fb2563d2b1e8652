"""OpenTelemetry: a real `netgain serve --otlp-endpoint` exports to an OTLP/HTTP receiver run here.

The receiver speaks the collector's protocol: `POST /v1/traces` with an `application/x-protobuf`
body parsed as `ExportTraceServiceRequest` (opentelemetry-proto's own messages), answered with an
`ExportTraceServiceResponse`. Requests carry W3C `traceparent` metadata; the spans must continue
their traces, and the phase spans must equal the `server-timing` trailer.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import ServerHandle, ServerLauncher
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from netgain.contract.phases import PHASES, parse_trailer
from netgain.protos import pb
from netgain.server.telemetry.histograms import EXEMPLAR_ID_CHARS_WITH_TRACE, DurationHistograms
from netgain.server.telemetry.otlp import parse_traceparent

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto is not installed (pip install 'netgain[serve]')",
)

SPAN_KIND_SERVER = 2
STATUS_CODE_ERROR = 2


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1:0 keeping every span it was sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.posts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(415 if self.path == "/v1/traces" else 404)
                    self.end_headers()
                    return
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                with receiver.lock:
                    receiver.posts += 1
                    for rs in req.resource_spans:
                        receiver.resources.append({kv.key: _value(kv.value) for kv in rs.resource.attributes})
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _value(v: Any) -> Any:
    return v.string_value if v.HasField("string_value") else v.int_value


def attrs(span: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.close()


def infer(server: ServerHandle, rid: str, traceparent: str | None) -> dict[str, str]:
    metadata = [("x-request-id", rid)]
    if traceparent is not None:
        metadata.append(("traceparent", traceparent))
    request = pb.InferRequest(inputs=[pb.Input(data=b"payload")])
    _, call = server.stub().Infer.with_call(request, metadata=metadata, timeout=10.0)
    return {m.key: str(m.value) for m in call.trailing_metadata()}


def wait_for_requests(receiver: Receiver, rids: set[str], timeout_s: float = 20.0) -> list[Any]:
    end = time.monotonic() + timeout_s
    while True:
        spans = receiver.snapshot()
        seen = {attrs(s).get("netgain.request_id") for s in spans if s.name == "netgain.request"}
        if rids <= seen or time.monotonic() > end:
            return spans
        time.sleep(0.1)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_spans_continue_the_clients_trace(
    start_server: ServerLauncher, receiver: Receiver, workers: str
) -> None:
    server = start_server(
        "--model", "null", "--workers", workers, "--otlp-endpoint", receiver.url, "--max-queue-delay-ms", "5"
    )
    sent: dict[str, tuple[str, str]] = {}  # request id -> (trace id, parent span id), hex
    trailers: dict[str, dict[str, str]] = {}
    for i in range(6):
        trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
        rid = f"traced-{workers}-{i}"
        sent[rid] = (trace_id, parent)
        trailers[rid] = infer(server, rid, f"00-{trace_id}-{parent}-01")
    untraced = [f"fresh-{workers}-{i}" for i in range(2)]
    for rid in untraced:
        trailers[rid] = infer(server, rid, None)
    trailers["malformed"] = infer(server, "malformed", "00-" + "0" * 32 + "-" + "1" * 16 + "-01")

    spans = wait_for_requests(receiver, set(trailers))
    requests = {attrs(s)["netgain.request_id"]: s for s in spans if s.name == "netgain.request"}
    assert set(trailers) <= set(requests), f"missing request spans: {set(trailers) - set(requests)}"
    children: dict[bytes, list[Any]] = {}
    for s in spans:
        if s.name in PHASES:
            children.setdefault(s.parent_span_id, []).append(s)

    for rid, trailer in trailers.items():
        span = requests[rid]
        if rid in sent:  # the client's trace, continued: same trace id, the client's span as parent
            assert span.trace_id.hex() == sent[rid][0]
            assert span.parent_span_id.hex() == sent[rid][1]
        else:  # no (valid) traceparent: a trace of its own, a root span
            assert len(span.trace_id) == 16 and any(span.trace_id)
            assert span.trace_id.hex() not in {t for t, _ in sent.values()}
            assert span.parent_span_id == b""
        assert span.kind == SPAN_KIND_SERVER
        a = attrs(span)
        assert a["netgain.code"] == "OK" and a["rpc.grpc.status_code"] == 0
        assert a["netgain.model"] == "null" and a["netgain.device"] == "cpu"
        phases, batch = parse_trailer(trailer["server-timing"])
        assert batch is not None
        assert (a["netgain.batch.id"], a["netgain.batch.size"]) == batch
        # Durations equal the trailer's (microsecond resolution there, ns here).
        assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6 == pytest.approx(
            phases["total"], abs=0.0006
        )
        kids = sorted(children.get(span.span_id, []), key=lambda s: PHASES.index(s.name))
        assert [k.name for k in kids] == [p for p in PHASES if p in phases]
        cursor = span.start_time_unix_nano
        for k in kids:
            assert k.trace_id == span.trace_id
            assert k.start_time_unix_nano == cursor  # laid end to end from arrival
            assert (k.end_time_unix_nano - k.start_time_unix_nano) / 1e6 == pytest.approx(
                phases[k.name], abs=0.0006
            )
            cursor = k.end_time_unix_nano
    fresh = {requests[rid].trace_id for rid in [*untraced, "malformed"]}
    assert len(fresh) == 3  # each its own new trace

    # A span per batch, linked to its requests' spans; with --workers the device process exports
    # them from the ids each frontend handed over with the request.
    by_request = {(s.trace_id, s.span_id): rid for rid, s in requests.items()}
    end = time.monotonic() + 20
    while True:
        batches = [s for s in receiver.snapshot() if s.name == "netgain.batch"]
        linked = {by_request.get((lk.trace_id, lk.span_id)) for b in batches for lk in b.links}
        if set(trailers) <= linked or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert set(trailers) <= linked
    for b in batches:
        assert b.end_time_unix_nano >= b.start_time_unix_nano
        assert attrs(b)["netgain.batch.requests"] == len(b.links)
        linked_batch = {
            attrs(requests[r])["netgain.batch.id"]
            for r in {by_request.get((lk.trace_id, lk.span_id)) for lk in b.links}
            if r
        }
        assert linked_batch <= {attrs(b)["netgain.batch.id"]}
    assert all(r["service.name"] == "netgain" for r in receiver.resources)

    # Exemplars carry the trace id beside the request id; exported spans are counted.
    families = {f.name: f for f in parse_openmetrics(server.metrics_text(openmetrics=True))}
    exemplars = [
        s.exemplar for s in families["netgain_request_duration_seconds"].samples if s.exemplar is not None
    ]
    assert exemplars
    for ex in exemplars:
        rid = ex.labels["request_id"]
        assert rid in requests
        assert ex.labels["trace_id"] == requests[rid].trace_id.hex()
    exported = [s.value for s in families["netgain_otlp_spans_exported"].samples if s.name.endswith("_total")]
    assert sum(exported) > 0


def test_a_failing_receiver_never_fails_a_request(start_server: ServerLauncher) -> None:
    # A port nobody listens on: every export fails; requests still succeed, drops are counted.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    server = start_server("--model", "null", "--workers", "0", "--otlp-endpoint", dead)
    for i in range(20):
        trailer = infer(server, f"r{i}", f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01")
        assert "server-timing" in trailer
    end = time.monotonic() + 15.0
    dropped = 0.0
    while time.monotonic() < end:
        families = {f.name: f for f in parse_openmetrics(server.metrics_text(openmetrics=True))}
        dropped = sum(
            s.value
            for s in families["netgain_otlp_spans_dropped"].samples
            if s.name.endswith("_total") and s.labels["reason"] == "export_failed"
        )
        if dropped > 0:
            break
        time.sleep(0.2)
    assert dropped > 0
    assert server.health() == 1  # SERVING
    assert server.terminate() == 0
    assert server.output().count("OTLP export to") == 1  # logged once


def test_bad_endpoint_is_refused() -> None:
    from netgain.server.config import ServeConfig

    with pytest.raises(ValueError, match="--otlp-endpoint"):
        ServeConfig(otlp_endpoint="127.0.0.1:4318").validate()


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", True),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later", True),  # a later version
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", False),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),  # upper case
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", False),
        ("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("", False),
    ],
)
def test_parse_traceparent(value: str, ok: bool) -> None:
    parsed = parse_traceparent(value)
    assert (parsed is not None) == ok
    if parsed is not None:
        assert parsed[0].hex() == value[3:35] and parsed[1].hex() == value[36:52]


def test_exemplar_fits_trace_id_only_within_128_characters() -> None:
    import numpy as np

    h = DurationHistograms({"model": "m"}, [0.001, 0.01, 0.1])
    tid = "ab" * 16
    short, long_ = "a" * EXEMPLAR_ID_CHARS_WITH_TRACE, "b" * (EXEMPLAR_ID_CHARS_WITH_TRACE + 1)
    h.add(np.array([[0.0005], [0.005]]), [short, long_], (0,), [tid, tid])
    ex = [e for e in h.exemplars if e is not None]
    assert {"request_id": short, "trace_id": tid} in [e.labels for e in ex]
    assert {"request_id": long_} in [e.labels for e in ex]  # the id kept, the trace id left out
    for e in ex:
        assert sum(len(k) + len(v) for k, v in e.labels.items()) <= 128
