"""The HTTP sender's parts without a load run: the requests it builds (KServe v2 REST tensors, JSON
or binary; request templates and their checks), and its client against real loopback servers that
answer as scripted (keep-alive, chunked, close-delimited, Server-Timing, failures, deadlines)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from netgain.contract.messages import Plan
from netgain.loadgen.http_requests import (
    check_template,
    load_template,
    oip_http_request,
    template_request,
)
from netgain.loadgen.payloads import PayloadFactory
from netgain.loadgen.runner.http_client import HttpFailure, HttpPool
from netgain.loadgen.runner.http_sender import HttpSender
from netgain.protos import pb

OIP_BYTES = {"oip.model": "m", "oip.input": "payload", "oip.datatype": "BYTES", "oip.shape": "-1,-1"}
OIP_FP32 = {"oip.model": "t", "oip.input": "features", "oip.datatype": "FP32", "oip.shape": "-1,4"}


def _items(model: str, n: int, options: dict[str, str] | None = None) -> list[pb.Input]:
    factory = PayloadFactory(model, options or {}, seed=3, variants=4)
    return factory.inputs(factory.key(0, 0, n))


def _binary_parts(body: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], bytes]:
    cut = int(headers["Inference-Header-Content-Length"])
    return json.loads(body[:cut]), body[cut:]


# -- KServe v2 REST bodies -------------------------------------------------------------------------
def test_oip_http_bytes_go_binary_and_decode_to_the_items() -> None:
    items = _items("image", 3)
    request = oip_http_request(OIP_BYTES)
    assert (request.method, request.path) == ("POST", "/v2/models/m/infer")
    body, own = request.encode(items)
    headers = dict(own)
    assert headers["Content-Type"] == "application/octet-stream"
    doc, blob = _binary_parts(body, headers)
    tensor = doc["inputs"][0]
    assert tensor["name"] == "payload" and tensor["datatype"] == "BYTES" and tensor["shape"] == [3, 1]
    assert tensor["parameters"]["binary_data_size"] == len(blob)
    assert doc["parameters"]["binary_data_output"] is True
    decoded, at = [], 0
    while at < len(blob):  # BYTES elements: 4-byte little-endian length, then the bytes
        (n,) = struct.unpack_from("<I", blob, at)
        decoded.append(blob[at + 4 : at + 4 + n])
        at += 4 + n
    assert decoded == [i.data for i in items] and decoded[0].startswith(b"\xff\xd8\xff")


def test_oip_http_fp32_goes_json_until_it_is_large() -> None:
    items = _items("tabular", 2, {"features": "4"})
    body, own = oip_http_request(OIP_FP32).encode(items)
    assert dict(own) == {"Content-Type": "application/json"}
    tensor = json.loads(body)["inputs"][0]
    assert tensor["shape"] == [2, 4]
    assert tensor["data"] == pytest.approx([v for i in items for v in i.features])
    # always: the same rows as little-endian float32 after the JSON header
    body, own = oip_http_request(OIP_FP32, "always").encode(items)
    doc, blob = _binary_parts(body, dict(own))
    assert "data" not in doc["inputs"][0]
    assert list(struct.unpack("<8f", blob)) == pytest.approx([v for i in items for v in i.features])
    # auto: a tensor over 64 KiB of JSON goes binary
    wide = {**OIP_FP32, "oip.shape": "-1,8192"}
    body, own = oip_http_request(wide).encode(_items("tabular", 1, {"features": "8192"}))
    assert "Inference-Header-Content-Length" in dict(own) and len(body) < 8192 * 5


def test_oip_http_never_sends_text_as_json_and_refuses_bytes() -> None:
    text = _items("text", 2)
    body, _ = oip_http_request(OIP_BYTES, "never").encode(text)
    assert json.loads(body)["inputs"][0]["data"] == [i.data.decode() for i in text]
    with pytest.raises(ValueError, match="not UTF-8 text"):
        oip_http_request(OIP_BYTES, "never").encode(_items("null", 1))


# -- request templates -----------------------------------------------------------------------------
def _template(tmp_path: Path, doc: Any, name: str = "t.json") -> dict[str, Any]:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return load_template(str(path))


def test_template_puts_the_payload_in_the_body(tmp_path: Path) -> None:
    t = _template(
        tmp_path,
        'path: /v1/predict?x=1\nheaders: {Authorization: "Bearer k"}\nexpect_status: [200, 201]\n'
        'body:\n  image: "data:image/jpeg;base64,{payload_b64}"\n  all: "{payloads_b64}"\n  n: "{items}"\n',
        "t.yaml",
    )
    assert t["method"] == "POST" and t["expect_status"] == [200, 201]
    request = template_request(t)
    assert dict(request.headers) == {"Authorization": "Bearer k", "Content-Type": "application/json"}
    items = _items("image", 1)
    body, _ = request.encode(items)
    doc = json.loads(body)
    assert doc["n"] == 1
    assert base64.b64decode(doc["image"].removeprefix("data:image/jpeg;base64,")) == items[0].data
    assert [base64.b64decode(x) for x in doc["all"]] == [items[0].data]
    rows = template_request(_template(tmp_path, {"path": "/r", "body": {"rows": "{features_rows}"}}))
    tab = _items("tabular", 3)
    np.testing.assert_allclose(json.loads(rows.encode(tab)[0])["rows"], [list(i.features) for i in tab])
    raw = template_request(_template(tmp_path, {"path": "/raw", "body": "{payload}"}))
    assert raw.encode(items)[0] == items[0].data
    assert dict(raw.headers)["Content-Type"] == "application/octet-stream"


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"path": "/p", "verb": "POST"}, "unknown key"),
        ({"path": "p"}, "starts with /"),
        ({"path": "/p", "method": "GET", "body": {"x": 1}}, "has no body"),
        ({"path": "/p", "headers": {"Host": "x"}}, "written by the load generator"),
        ({"path": "/p", "expect_status": 700}, "expect_status"),
        ({"path": "/p", "body": {"x": "a {payloads_b64}"}}, "must be a whole string"),
        ({"path": "/p", "body": {"x": "{payload}"}}, "must be the whole body"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_bad_template_says_what_is_wrong(tmp_path: Path, doc: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _template(tmp_path, doc)


def test_template_placeholders_must_suit_the_payloads(tmp_path: Path) -> None:
    one = _template(tmp_path, {"path": "/p", "body": {"image": "{payload_b64}"}})
    check_template(one, features=False, max_items=1)
    with pytest.raises(ValueError, match=r"up to 4: use \{payloads_b64\}"):
        check_template(one, features=False, max_items=4)
    with pytest.raises(ValueError, match="payloads are feature vectors"):
        check_template(one, features=True, max_items=1)
    rows = _template(tmp_path, {"path": "/p", "body": {"rows": "{features_rows}"}})
    with pytest.raises(ValueError, match="payloads are bytes"):
        check_template(rows, features=False, max_items=1)
    with pytest.raises(ValueError, match="not UTF-8 text"):  # caught when built: the null payloads
        text = _template(tmp_path, {"path": "/p", "body": {"t": "{payload_text}"}})
        template_request(text).encode(_items("null", 1))


# -- the client, against scripted loopback servers ---------------------------------------------------
Script = Callable[[bytes, int], bytes | None]  # (request bytes, how many this connection had) -> answer


class Scripted:
    """A real TCP server on 127.0.0.1: per complete request (headers and Content-Length body) it
    writes what ``script`` returns (None: closes the connection without answering; ``close_after``:
    closes it after each answer)."""

    def __init__(self, script: Script, close_after: bool = False) -> None:
        self.script = script
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                n += 1
                answer = self.script(request, n)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30.0))


def _get(path: str = "/") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()


def test_client_reuses_connections_and_reads_every_body_form() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"
    timing = b"Server-Timing: queue;dur=0.5, kernel;dur=2.25\r\nserver-timing: total;dur=3.5\r\n"

    def script(request: bytes, n: int) -> bytes | None:
        if b"/chunked" in request:
            return chunked
        if b"/timing" in request:
            return _ok(b"{}", timing)
        return _ok()

    async def main() -> tuple[Scripted, list[Any], int]:
        async with Scripted(script) as srv:
            pool = HttpPool("127.0.0.1", srv.port, timeout_s=5.0)
            answers = []
            for path in ("/a", "/chunked", "/timing", "/b"):  # one after another: one connection
                answers.append(await pool.request(_get(path)))
            concurrent = await asyncio.gather(*(pool.request(_get("/c")) for _ in range(5)))
            opened = pool.opened
            pool.close()
            return srv, [*answers, *concurrent], opened

    srv, answers, opened = _run(main())
    assert [a.status for a in answers] == [200] * 9
    assert answers[1].size == 7 and answers[1].body == b"abcdefg"
    assert answers[2].timing == "queue;dur=0.5, kernel;dur=2.25, total;dur=3.5"  # both headers, joined
    assert opened == srv.connections == 5  # the five at once needed five; the first was reused
    assert len(srv.requests) == 9


def test_client_reads_a_body_delimited_by_close_and_does_not_reuse_it() -> None:
    async def main() -> tuple[list[Any], int]:
        async with Scripted(
            lambda r, n: b"HTTP/1.0 503 Busy\r\n\r\nbusy, try later", close_after=True
        ) as srv:
            pool = HttpPool("127.0.0.1", srv.port, timeout_s=5.0)
            first = await pool.request(_get())
            second = await pool.request(_get())
            pool.close()
            return [first, second], srv.connections

    answers, connections = _run(main())
    assert [(a.status, a.body) for a in answers] == [(503, b"busy, try later")] * 2
    assert connections == 2


@pytest.mark.parametrize(
    ("script", "code", "reason"),
    [
        (lambda r, n: None, "UNAVAILABLE", "connection closed before the response"),
        (lambda r, n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", None, None),  # then stalls
        (
            lambda r, n: b"\x00\x00\x18\x04\x00\x00\x00\x00\x00 not http",
            "INTERNAL",
            "not an HTTP/1.1 response",
        ),
    ],
)
def test_client_failures_have_a_code_and_a_reason(
    script: Script, code: str | None, reason: str | None
) -> None:
    async def main() -> HttpFailure:
        async with Scripted(script) as srv:
            pool = HttpPool("127.0.0.1", srv.port, timeout_s=0.5)
            try:
                with pytest.raises(HttpFailure) as info:
                    await pool.request(_get())
            finally:
                pool.close()
            return info.value

    failure = _run(main())
    # A body that never completes ends at the deadline.
    assert failure.code == (code or "DEADLINE_EXCEEDED")
    assert (reason or "no response within 0.5 s") in failure.reason


def test_client_says_connection_refused() -> None:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> HttpFailure:
        pool = HttpPool("127.0.0.1", port, timeout_s=2.0)
        with pytest.raises(HttpFailure) as info:
            await pool.request(_get())
        pool.close()
        return info.value

    failure = _run(main())
    assert (failure.code, failure.reason) == ("UNAVAILABLE", "connection refused")


def test_sender_sends_request_ids_and_maps_statuses() -> None:
    """The sender's own bytes on the wire (request line, Host, x-request-id, body) and its outcomes:
    OK with the phases, a 404 kept as NOT_FOUND with its status and the server's reason."""

    def script(request: bytes, n: int) -> bytes | None:
        if b"x-request-id: run1-7\r\n" in request:
            body = b'{"detail": "no such model"}'
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        return _ok(b"{}", b"Server-Timing: queue;dur=1.5, kernel;dur=4, total;dur=6\r\n")

    async def main() -> tuple[list[Any], list[bytes]]:
        async with Scripted(script) as srv:
            target = f"127.0.0.1:{srv.port}"
            plan = Plan(
                run_id="run1", worker=0, workers=1, targets=[target], model="null", handler_options={},
                seed=0, mode="open", warmup_ns=0, timeout_s=5.0, max_in_flight=10, protocol="http-json",
                http={"method": "PUT", "path": "/p", "headers": {"X-A": "1"}, "body": {"d": "{payload_b64}"},
                      "expect_status": [200], "ready_path": None},
            )  # fmt: skip
            sender = HttpSender(plan)
            messages = sender.build(np.array([6, 7]), np.array([0, 0]), np.array([1, 1], dtype=np.int32))
            await sender.open()
            outcomes = [
                await sender.finish(sender.start(m, i, 0)) for m, i in zip(messages, (6, 7), strict=True)
            ]
            await sender.close()
            return outcomes, srv.requests

    outcomes, requests = _run(main())
    head, _, body = requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"PUT /p HTTP/1.1" and b"x-request-id: run1-6" in lines and b"X-A: 1" in lines
    assert b"Content-Length: %d" % len(body) in lines
    factory = PayloadFactory("null", {}, 0)
    payload = factory.inputs(factory.key(6, 0, 1))[0].data
    assert base64.b64decode(json.loads(body)["d"]) == payload
    status, size, answer = outcomes[0]
    assert (status, size, answer["http_status"], answer["error"]) == ("OK", 2, 200, None)
    assert (answer["queue_ms"], answer["kernel_ms"], answer["server_total_ms"]) == (1.5, 4.0, 6.0)
    status, size, answer = outcomes[1]
    assert (status, size, answer["http_status"]) == ("NOT_FOUND", 0, 404)
    assert answer["error"] == "HTTP 404: no such model"


def test_cancel_ends_the_requests_in_flight() -> None:
    """After a Ctrl-C's drain the sender cancels what is still in flight: those rows are CANCELLED,
    whether the request was sent or still connecting."""

    async def main() -> list[Any]:
        async with Scripted(lambda r, n: b"") as srv:  # reads the request, never answers
            pool = HttpPool("127.0.0.1", srv.port, timeout_s=30.0)
            sent = pool.request(_get())
            while not srv.requests:
                await asyncio.sleep(0.01)
            connecting = pool.request(_get())  # a second connection, not yet open
            pool.cancel("cancelled after the stop's drain")
            out = []
            for waiter in (sent, connecting):
                with pytest.raises(HttpFailure) as info:
                    await waiter
                out.append(info.value)
            pool.close()
            return out

    failures = _run(main())
    assert [(f.code, f.reason) for f in failures] == [("CANCELLED", "cancelled after the stop's drain")] * 2


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--protocol", "http-json", "--model", "image"], "needs --request-template FILE"),
        (["--protocol", "http-json", "--request-template", "{t}"], "which payloads go into the template"),
        (["--request-template", "{t}"], "--request-template needs --protocol http-json"),
        (["--oip-binary", "always", "--model", "null"], "--oip-binary needs --protocol oip-http"),
        (["--protocol", "oip-http", "--oip-model", "m", "--model", "image", "--oip-binary", "never"],
         "image and null need the binary-data extension"),
        (["--protocol", "oip-http", "--oip-model", "m", "--model", "null", "--target", "http://h:80"],
         "takes HOST:PORT"),
        (["--protocol", "http-json", "--request-template", "{t}", "--model", "image",
          "--items", "1:0.5,2:0.5"],
         "--request-template: {payload_b64} carries one item, but --items sends up to 2"),
    ],
)  # fmt: skip
def test_http_flags_are_checked_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    from netgain.cli import main

    template = tmp_path / "t.json"
    template.write_text(json.dumps({"path": "/p", "body": {"image": "{payload_b64}"}}))
    flags = [f.replace("{t}", str(template)) for f in flags]
    target = [] if "--target" in flags else ["--target", "127.0.0.1:9"]
    assert main(["load", *target, "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("netgain load: error: ") and says in err, err
    assert not (tmp_path / "run").exists()
