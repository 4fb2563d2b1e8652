"""Bad input against real server processes: every case gets a gRPC status with a message,
the server stays up, and ``netgain_requests_total{code=...}`` counts every case exactly.

The oracle for payloads is the same handler in process: the server must answer OK exactly
when ``preprocess`` accepts the payload, and INVALID_ARGUMENT (with a message) otherwise.
Raw garbage on the gRPC and metrics ports (and HTTP/1 on the gRPC port) must not take the
server down.
"""

from __future__ import annotations

import math
import random
import socket
import time
from collections import Counter
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_helpers import requests_by_code, wait_for_counts
from test_reliability_fuzz_handlers import feature_vectors, image_payloads, text_payloads

from netgain.protos import pb
from netgain.server.handlers.base import Handler, InvalidInput
from netgain.server.handlers.image import ImageHandler
from netgain.server.handlers.tabular import TabularHandler
from netgain.server.handlers.text import TextHandler
from netgain.server.service import REQUEST_ID_RE

pytestmark = pytest.mark.slow

MAX_ITEMS = 8
IMAGE_OPTS = {"size": "32", "max_pixels": "1000000"}
TEXT_OPTS = {"max_len": "16", "layers": "1", "d_model": "32", "heads": "2"}
TAB_OPTS = {"features": "16"}
N_PAYLOAD = 200  # cases per handler
N_FIELDS = 300  # RPC-field cases (model, inputs, request id)
SERVER = settings(
    deadline=None,
    database=None,
    print_blob=True,
    max_examples=N_PAYLOAD,
    suppress_health_check=list(HealthCheck),
)


def options_args(opts: dict[str, str]) -> list[str]:
    return [a for k, v in opts.items() for a in ("--handler-option", f"{k}={v}")]


@pytest.fixture(scope="module")
def servers(start_server_module: Any) -> dict[str, Any]:
    common = ["--max-items-per-request", str(MAX_ITEMS), "--max-batch-size", "8", "--warmup-batches", "1"]
    return {
        "image": start_server_module("--model", "image", *options_args(IMAGE_OPTS), *common),
        "text": start_server_module("--model", "text", *options_args(TEXT_OPTS), *common),
        "tabular": start_server_module("--model", "tabular", *options_args(TAB_OPTS), *common),
    }


class Tally:
    """Client-side count of every answer, checked against the server's counter at the end."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.before = requests_by_code(server.metrics_text())
        self.codes: Counter[str] = Counter()

    def infer(self, req: pb.InferRequest, rid: str | None = None) -> tuple[grpc.StatusCode, str]:
        md = (("x-request-id", rid),) if rid is not None else None
        try:
            self.server.stub().Infer(req, metadata=md, timeout=30.0)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
            assert details.strip(), f"{code.name} without a message"
        assert code != grpc.StatusCode.INTERNAL, details
        self.codes[code.name] += 1
        return code, details

    def check_metrics(self) -> dict[str, float]:
        expect = {k: self.before.get(k, 0.0) + v for k, v in self.codes.items()}
        after = wait_for_counts(self.server.metrics_text, expect)
        delta = {k: after.get(k, 0.0) - self.before.get(k, 0.0) for k in after}
        assert {k: v for k, v in delta.items() if v} == {k: float(v) for k, v in self.codes.items()}
        return delta


def predicted(handler: Handler, inputs: list[pb.Input]) -> grpc.StatusCode:
    try:
        for item in inputs:
            handler.preprocess(item)
    except InvalidInput:
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.OK


def fuzz_payloads(server: Any, handler: Handler, inputs_strategy: Any) -> Counter[str]:
    tally = Tally(server)

    @SERVER
    @given(inputs_strategy)
    def case(inputs: list[pb.Input]) -> None:
        expect = predicted(handler, inputs)
        if not all(i.data or i.features for i in inputs):
            expect = grpc.StatusCode.INVALID_ARGUMENT  # empty input: rejected before the handler
        code, details = tally.infer(pb.InferRequest(inputs=inputs))
        assert code == expect, details

    case()
    assert server.proc.poll() is None
    tally.check_metrics()
    assert sum(tally.codes.values()) >= N_PAYLOAD
    assert tally.codes["INVALID_ARGUMENT"] > N_PAYLOAD // 4 and tally.codes["OK"] > 0
    print(
        f"\n{server.args[1]}: {sum(tally.codes.values())} requests, {dict(tally.codes)}, "
        "counted by the server"
    )
    return tally.codes


def test_image_payloads_over_grpc(servers: dict[str, Any]) -> None:
    items = st.lists(image_payloads().map(lambda d: pb.Input(data=d)), min_size=1, max_size=3)
    fuzz_payloads(servers["image"], ImageHandler(IMAGE_OPTS), items)


def test_text_payloads_over_grpc(servers: dict[str, Any]) -> None:
    items = st.lists(text_payloads().map(lambda d: pb.Input(data=d)), min_size=1, max_size=3)
    fuzz_payloads(servers["text"], TextHandler(TEXT_OPTS), items)


def test_tabular_payloads_over_grpc(servers: dict[str, Any]) -> None:
    items = st.lists(feature_vectors().map(lambda f: pb.Input(features=f)), min_size=1, max_size=3)
    fuzz_payloads(servers["tabular"], TabularHandler(TAB_OPTS), items)


PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))
ids = st.one_of(
    st.none(),
    st.text(alphabet="abcXYZ019._:-", min_size=1, max_size=140),
    st.text(alphabet=PRINTABLE + " ", min_size=1, max_size=140).filter(lambda s: s == s.strip()),
)


@st.composite
def rpc_fields(draw: st.DrawFn) -> tuple[pb.InferRequest, str | None]:
    model = draw(st.one_of(st.just(""), st.just("tabular"), st.text(max_size=30)))
    good = pb.Input(features=[0.5] * 16)
    n = draw(st.one_of(st.integers(0, 2), st.integers(MAX_ITEMS - 1, MAX_ITEMS + 40)))
    inputs = [good] * n
    spoil = draw(st.booleans())
    if inputs and spoil:
        inputs[draw(st.integers(0, n - 1))] = draw(
            st.sampled_from(
                [
                    pb.Input(),
                    pb.Input(features=[math.nan] * 16),
                    pb.Input(features=[1.0] * 3),
                    pb.Input(data=b"\xff\xfe", features=[0.0] * 16),
                ]
            )
        )
    return pb.InferRequest(model=model, inputs=inputs), draw(ids)


def test_every_rpc_field_over_grpc(servers: dict[str, Any]) -> None:
    server = servers["tabular"]
    tally = Tally(server)
    handler = TabularHandler(TAB_OPTS)

    @settings(SERVER, max_examples=N_FIELDS)
    @given(rpc_fields())
    def case(fields: tuple[pb.InferRequest, str | None]) -> None:
        req, rid = fields
        code, details = tally.infer(req, rid)
        if rid is not None and not REQUEST_ID_RE.match(rid):
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "x-request-id" in details
        elif req.model not in ("", "tabular"):
            assert code == grpc.StatusCode.NOT_FOUND and "tabular" in details
        elif (
            not req.inputs
            or len(req.inputs) > MAX_ITEMS
            or any(not i.data and not i.features for i in req.inputs)
        ):
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        else:
            assert code == predicted(handler, list(req.inputs)), details

    case()
    assert server.proc.poll() is None
    tally.check_metrics()
    assert tally.codes["NOT_FOUND"] > 0 and tally.codes["INVALID_ARGUMENT"] > 0 and tally.codes["OK"] > 0
    print(f"\nrpc fields: {sum(tally.codes.values())} requests, {dict(tally.codes)}, counted by the server")


# -- raw bytes on the ports --------------------------------------------------------------------
def blast(port: int, payload: bytes, read: bool = True) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        try:
            sock.sendall(payload)
            if read:
                sock.recv(4096)
        except OSError:
            pass  # the server may close on us: that is fine


def test_garbage_bytes_on_both_ports_do_not_take_the_server_down(servers: dict[str, Any]) -> None:
    server = servers["image"]
    rng = random.Random(7)
    http1 = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    payloads = [
        http1,
        b"POST /netgain.v1.Inference/Infer HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        preface,  # a valid preface, then nothing
        preface + bytes(rng.getrandbits(8) for _ in range(2048)),  # preface then garbage frames
        preface + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\xff" * 4096,  # SETTINGS, then junk
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(300),  # a TLS ClientHello on a plaintext port
        b"",
    ] + [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8192))) for _ in range(40)]
    for payload in payloads:
        blast(server.grpc_port, payload)
    for payload in [
        *payloads,
        b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /" + b"%" * 5000 + b" HTTP/1.0\r\n\r\n",
    ]:
        blast(server.metrics_port, payload)
    # Half-open connections that never finish a request: the server must not wait on them.
    idle = [
        socket.create_connection(("127.0.0.1", p), timeout=2.0)
        for p in (server.grpc_port, server.metrics_port)
    ]
    try:
        for sock in idle:
            sock.sendall(b"GET /")
        t0 = time.monotonic()
        resp = server.stub().Infer(
            pb.InferRequest(inputs=[ImageHandler(IMAGE_OPTS).example_input(random.Random(0), 2000)]),
            timeout=10.0,
        )
        assert len(resp.outputs) == 1 and time.monotonic() - t0 < 10.0
        assert "netgain_requests_total" in server.metrics_text()
    finally:
        for sock in idle:
            sock.close()
    assert server.proc.poll() is None
    assert len(payloads) == 47
