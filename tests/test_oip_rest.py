"""KServe v2 REST (the Open Inference Protocol over HTTP) served by `netgain serve --http-port`: plain
HTTP requests (JSON and the binary tensor data extension), Triton's own HTTP client, the phases in a
`server-timing` header that netgain/contract/phases.py parses, the protocol's errors, health, and the
same span log and counters as gRPC; in the one-process server and with --workers."""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import time
import urllib.request
from typing import Any

import numpy as np
import pytest
from conftest import HOST, run_netgain

from netgain.contract.payloads import synthetic_jpeg, tabular_features
from netgain.contract.phases import PHASES, REQUEST_ID_KEY, TIMING_KEY, parse_trailer
from netgain.protos import pb
from netgain.server.oip import BadTensor, ModelIO
from netgain.server.rest.codec import (
    HEADER_LENGTH,
    SCAN_ABOVE,
    body_id,
    encode_response,
    json_values,
    max_json_values,
    read_infer,
    split_body,
)

RNG = random.Random(11)
TIMEOUT_S = 30.0
DTYPES = {"INT64": "<i8", "FP32": "<f4"}


# -- helpers ---------------------------------------------------------------------------------------
def http_port(server: Any) -> int:
    return int(json.loads(server.ports_file.read_text())["http"])


def call(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def infer(
    port: int, head: dict[str, Any], raw: bytes | None = None, model: str = "null", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """POST an infer request: JSON alone, or JSON then ``raw`` (the binary tensor data extension)."""
    text = json.dumps(head).encode()
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    if raw is not None:
        hdrs[HEADER_LENGTH] = str(len(text))
        hdrs["Content-Type"] = "application/octet-stream"
        text += raw
    else:
        hdrs["Content-Type"] = "application/json"
    return call(port, "POST", f"/v2/models/{model}/infer", text, hdrs)


def raw_bytes(items: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


def bytes_tensor(items: list[bytes], binary: bool) -> tuple[dict[str, Any], bytes | None]:
    t: dict[str, Any] = {"name": "INPUT", "datatype": "BYTES", "shape": [len(items)]}
    if not binary:
        t["data"] = [b.decode() for b in items]
        return t, None
    raw = raw_bytes(items)
    t["parameters"] = {"binary_data_size": len(raw)}
    return t, raw


def outputs_of(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The response's JSON and its output tensors, whether in ``data`` or in the binary part."""
    cut = int(headers.get(HEADER_LENGTH.lower(), len(body)))
    head = json.loads(body[:cut])
    at, out = cut, {}
    for t in head["outputs"]:
        if "data" in t:
            values = np.asarray(t["data"], dtype=DTYPES[t["datatype"]])
        else:
            size = t["parameters"]["binary_data_size"]
            values = np.frombuffer(body[at : at + size], dtype=DTYPES[t["datatype"]])
            at += size
        out[t["name"]] = values.reshape(t["shape"])
    assert at == len(body), "the binary part holds exactly the declared outputs"
    return head, out


def check_timing(headers: dict[str, str], request_id: str, items: int | None) -> dict[str, float]:
    """The server-timing header is the gRPC trailer's value: every phase, total, the batch (0 items:
    refused before batching; None: either)."""
    assert headers[REQUEST_ID_KEY] == request_id
    phases, batch = parse_trailer(headers[TIMING_KEY])
    assert set(PHASES) <= set(phases) and phases["total"] > 0
    assert batch is not None
    if items:
        assert batch[0] >= 0 and batch[1] >= items
    elif items == 0:
        assert batch == (-1, 0)  # failed before it was batched
    return phases


def check_error(
    result: tuple[int, dict[str, str], bytes],
    status: int,
    code: str,
    text: str,
    rid: str = "",
    batched: bool = False,
) -> None:
    got, headers, body = result
    assert got == status, body
    error = json.loads(body)
    assert error["code"] == code and text in error["error"], error
    assert headers["content-type"].startswith("application/json")
    if rid:
        check_timing(headers, rid, None if batched else 0)


def counters(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=5.0) as resp:
        text = resp.read().decode()
    pattern = re.compile(r'^netgain_requests_total\{code="([A-Z_]+)"[^}]*\} ([0-9.e+]+)$', re.M)
    return {code: float(v) for code, v in pattern.findall(text)}


def wait_counters(metrics_port: int, want: dict[str, float], timeout_s: float = 15.0) -> dict[str, float]:
    """The request counters once the recorder has drained what was answered (it trails by ~50 ms)."""
    end = time.monotonic() + timeout_s
    while True:
        got = counters(metrics_port)
        if all(got.get(k, 0) >= v for k, v in want.items()) or time.monotonic() > end:
            return got
        time.sleep(0.05)


# -- the codec, without a server ---------------------------------------------------------------------
def test_codec_reads_json_and_binary_and_refuses_what_does_not_fit() -> None:
    bytes_io, feats_io = ModelIO("BYTES"), ModelIO("FP32", 2)

    def read(head: dict[str, Any], raw: bytes = b"", io: ModelIO = bytes_io, limit: int = 8) -> Any:
        body = json.dumps(head).encode()
        header, binary = split_body(body + raw, str(len(body)) if raw else None)
        return read_infer(header, binary, io, limit)

    t = {"name": "INPUT", "datatype": "BYTES"}
    assert [i.data for i in read({"inputs": [{**t, "shape": [2, 1], "data": [["ab"], ["é"]]}]}).inputs] == [
        b"ab",
        "é".encode(),
    ]
    raw = raw_bytes([b"\xff", b"xyz"])
    got = read({"inputs": [{**t, "shape": [2], "parameters": {"binary_data_size": len(raw)}}]}, raw)
    assert [i.data for i in got.inputs] == [b"\xff", b"xyz"]
    f = {"name": "INPUT", "datatype": "FP32"}
    got = read({"inputs": [{**f, "shape": [2, 2], "data": [[1, 2.5], [3, 4]]}]}, io=feats_io)
    assert [list(i.features) for i in got.inputs] == [[1, 2.5], [3, 4]]
    rows = np.arange(4, dtype="<f4").tobytes()
    got = read({"inputs": [{**f, "shape": [2, 2], "parameters": {"binary_data_size": 16}}]}, rows, feats_io)
    assert [list(i.features) for i in got.inputs] == [[0, 1], [2, 3]]

    refusals = [
        (
            {"inputs": [{**t, "shape": [1], "data": ["a"], "parameters": {"binary_data_size": 0}}]},
            b"",
            "both",
        ),
        ({"inputs": [{**t, "shape": [1]}]}, b"", "has no data"),
        ({"inputs": [{**t, "shape": [9], "data": ["a"]}]}, b"", "request has 9 inputs, over the limit of 8"),
        ({"inputs": [{**t, "shape": [1], "data": ["a"] * 1000}]}, b"", "holds 1 elements, the data more"),
        ({"inputs": [{**t, "shape": [3], "data": ["a", "b"]}]}, b"", "holds 3 elements, the data 2"),
        ({"inputs": [{**t, "shape": [1], "data": [7]}]}, b"", "BYTES data in JSON are strings"),
        ({"inputs": [{**t, "shape": [2], "parameters": {"binary_data_size": 9}}]}, raw, "binary part is 12"),
        ({"inputs": [{**t, "shape": [3], "parameters": {"binary_data_size": 12}}]}, raw, "holds 3 elements"),
        ({"inputs": [{**t, "shape": [1.5], "data": ["a"]}]}, b"", "whole numbers"),
        ({"inputs": [{**t, "datatype": "INT32", "shape": [1], "data": [1]}]}, b"", "is INT32"),
        ({"inputs": [{**t, "name": "x", "shape": [1], "data": ["a"]}]}, b"", "'x' is not this model's"),
        ({"inputs": []}, b"", "0 input tensors"),
        ({"inputs": [{**t, "shape": [1], "data": ["a"]}], "outputs": [{"name": "PROB"}]}, b"", "'PROB'"),
    ]
    for head, data, message in refusals:
        with pytest.raises(BadTensor, match=re.escape(message)):
            read(head, data)
    with pytest.raises(BadTensor, match="rows of 2 features"):
        read({"inputs": [{**f, "shape": [1, 3], "data": [1, 2, 3]}]}, io=feats_io)
    with pytest.raises(BadTensor, match="must be numbers"):
        read({"inputs": [{**f, "shape": [1, 2], "data": [1, "2"]}]}, io=feats_io)
    with pytest.raises(BadTensor, match="not a JSON object"):
        split_body(b"{nope", None)
    with pytest.raises(BadTensor, match="outside the body"):
        split_body(b"{}", "3")
    # a large JSON part holding more values than max_items could need is refused before json.loads
    assert json_values(b'["a,b", [1, 2], {"k": 3}]', 100) == 8  # under the limit: counted raw
    assert json_values(b'["a,b", [1, 2], {"k": 3}]', 2) == 7  # over: commas in strings left out
    nested = b'{"inputs": [' + b"[]," * (SCAN_ABOVE // 3) + b"[]]}"
    with pytest.raises(BadTensor, match=r"holds up to \d+ values, more than 4352 .* binary data"):
        split_body(nested, None, max_json_values(bytes_io, 64))
    text = {"inputs": [{**t, "shape": [1], "data": ["a, [b] {c}, " * (SCAN_ABOVE // 8)]}]}
    header, _ = split_body(json.dumps(text).encode(), None, max_json_values(bytes_io, 64))
    assert len(read_infer(header, b"", bytes_io, 64).inputs[0].data) == 12 * (SCAN_ABOVE // 8)
    with pytest.raises(BadTensor, match="'id' must be a string"):
        body_id({"id": 5})
    assert body_id({"id": "r-1"}) == "r-1" and body_id({}) == ""

    # outputs: JSON by default, binary when asked (all, or one), in the order asked
    answers = [pb.Output(label=3, score=0.5), pb.Output(label=4, score=0.25)]
    body, cut = encode_response("m", "r1", answers, None)
    assert cut is None and json.loads(body)["outputs"][0] == {
        "name": "LABEL",
        "datatype": "INT64",
        "shape": [2],
        "data": [3, 4],
    }
    asked = read({"inputs": [{**t, "shape": [1], "data": ["a"]}], "parameters": {"binary_data_output": True}})
    body, cut = encode_response("m", "", answers, asked)
    head, out = outputs_of({HEADER_LENGTH.lower(): str(cut)}, body)
    assert "id" not in head and out["LABEL"].tolist() == [3, 4] and out["SCORE"].tolist() == [0.5, 0.25]
    asked = read(
        {
            "inputs": [{**t, "shape": [1], "data": ["a"]}],
            "outputs": [{"name": "SCORE", "parameters": {"binary_data": True}}, {"name": "LABEL"}],
        }
    )
    body, cut = encode_response("m", "", answers, asked)
    head, out = outputs_of({HEADER_LENGTH.lower(): str(cut)}, body)
    assert [t["name"] for t in head["outputs"]] == ["SCORE", "LABEL"] and "data" in head["outputs"][1]


# -- a real server -----------------------------------------------------------------------------------
def test_rest_null_model_json_binary_errors_health_spans_and_counters(start_server: Any) -> None:
    server = start_server(
        "--model", "null", "--workers", "0", "--http-port", "0",
        "--max-items-per-request", "8", "--max-message-mb", "0.01",
    )  # fmt: skip
    port = http_port(server)
    assert f"http http://{HOST}:{port}" in server.stdout()

    # health and metadata
    assert call(port, "GET", "/v2/health/live")[::2] == (200, b'{"live":true}')
    assert call(port, "GET", "/v2/health/ready")[::2] == (200, b'{"ready":true}')
    status, _, body = call(port, "GET", "/v2")
    assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]
    for path in ("/v2/models/null", "/v2/models/null/versions/1"):
        status, _, body = call(port, "GET", path)
        meta = json.loads(body)
        assert status == 200 and meta["name"] == "null" and meta["versions"] == ["1"]
        assert meta["inputs"] == [{"name": "INPUT", "datatype": "BYTES", "shape": [-1]}]
    assert call(port, "GET", "/v2/models/null/ready")[::2] == (200, b'{"name":"null","ready":true}')
    check_error(call(port, "GET", "/v2/models/resnet50"), 404, "NOT_FOUND", "'resnet50' is not served here")
    check_error(call(port, "GET", "/v2/models/resnet50/ready"), 404, "NOT_FOUND", "resnet50")
    check_error(call(port, "GET", "/v2/models/null/versions/2"), 404, "NOT_FOUND", "only version '1'")
    check_error(call(port, "GET", "/v1/models"), 404, "NOT_FOUND", "no such endpoint")
    check_error(call(port, "GET", "/v2/models/null/infer"), 405, "INVALID_ARGUMENT", "GET is not allowed")

    # JSON: the request id from x-request-id; the body's id echoed
    tensor, _ = bytes_tensor([b"hello", b"hi"], binary=False)
    status, headers, body = infer(port, {"id": "body-1", "inputs": [tensor]}, x_request_id="rest-json")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert HEADER_LENGTH.lower() not in headers
    head, out = outputs_of(headers, body)
    assert head["id"] == "body-1" and head["model_name"] == "null" and head["model_version"] == "1"
    assert out["LABEL"].tolist() == [5, 2] and out["SCORE"].dtype == np.float32  # null: the item's length
    check_timing(headers, "rest-json", 2)
    nested = {"name": "INPUT", "datatype": "BYTES", "shape": [2, 1], "data": [["abc"], ["d"]]}
    status, headers, body = infer(port, {"inputs": [nested]}, x_request_id="rest-nested")
    assert status == 200 and outputs_of(headers, body)[1]["LABEL"].tolist() == [3, 1]

    # binary: any bytes, outputs in the binary part; the body's id is the request id without a header
    tensor, raw = bytes_tensor([b"\xff\x00ab", b"xyz"], binary=True)
    head_in = {"id": "rest-bin", "inputs": [tensor], "parameters": {"binary_data_output": True}}
    status, headers, body = infer(port, head_in, raw)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    head, out = outputs_of(headers, body)
    assert all("data" not in t for t in head["outputs"]) and out["LABEL"].tolist() == [4, 3]
    check_timing(headers, "rest-bin", 2)
    asked = [{"name": "SCORE", "parameters": {"binary_data": True}}, {"name": "LABEL"}]
    status, headers, body = infer(
        port, {"inputs": [tensor], "outputs": asked}, raw, x_request_id="rest-mixed"
    )
    head, out = outputs_of(headers, body)
    assert status == 200 and [t["name"] for t in head["outputs"]] == ["SCORE", "LABEL"]
    assert "data" in head["outputs"][1] and out["LABEL"].tolist() == [4, 3]
    status, headers, _ = infer(port, {"inputs": [tensor]}, raw)  # no id at all: the server makes one
    assert status == 200 and headers[REQUEST_ID_KEY].startswith("srv")

    # errors: the status the protocol gives, the JSON error, and the timing header on each
    good, _ = bytes_tensor([b"a"], binary=False)
    both = {**tensor, "data": ["a", "b"]}
    check_error(infer(port, {"inputs": [good]}, model="resnet50", x_request_id="e-model"),
                404, "NOT_FOUND", "'resnet50' is not served here", "e-model")  # fmt: skip
    check_error(infer(port, {"inputs": [{**good, "datatype": "FP32", "data": [1.0]}]}, x_request_id="e-type"),
                400, "INVALID_ARGUMENT", "is FP32", "e-type")  # fmt: skip
    check_error(infer(port, {"inputs": [both]}, raw, x_request_id="e-both"),
                400, "INVALID_ARGUMENT", "both data and binary_data_size", "e-both")  # fmt: skip
    check_error(infer(port, {"inputs": [{**good, "shape": [9]}]}, x_request_id="e-items"),
                400, "INVALID_ARGUMENT", "request has 9 inputs, over the limit of 8", "e-items")  # fmt: skip
    big, big_raw = bytes_tensor([b"x" * 11000], binary=True)
    check_error(infer(port, {"inputs": [big]}, big_raw, x_request_id="e-size"),
                413, "RESOURCE_EXHAUSTED", "over the limit of 10485", "e-size")  # fmt: skip
    check_error(call(port, "POST", "/v2/models/null/infer", b"{not json", {REQUEST_ID_KEY: "e-json"}),
                400, "INVALID_ARGUMENT", "not a JSON object", "e-json")  # fmt: skip
    check_error(
        infer(port, {"inputs": [good]}, x_request_id="bad id!"), 400, "INVALID_ARGUMENT", "x-request-id"
    )
    wide = {f"x-pad-{i}": "p" * 6000 for i in range(3)}
    result = infer(port, {"inputs": [good]}, **wide, x_request_id="e-meta")
    check_error(result, 431, "RESOURCE_EXHAUSTED", "header-list size")
    assert result[1][REQUEST_ID_KEY] == "invalid"  # as on gRPC: the metadata was not read
    assert call(port, "GET", "/v2/health/ready")[0] == 200  # none of it hurt the server

    # the counters and the span log see REST requests like gRPC's
    want = {"OK": 5, "NOT_FOUND": 1, "INVALID_ARGUMENT": 5, "RESOURCE_EXHAUSTED": 2}
    assert wait_counters(server.metrics_port, want) == want
    server.terminate()
    spans = {s["id"]: s for s in server.span_lines()}
    assert spans["rest-json"]["code"] == "OK" and spans["rest-json"]["items"] == 2
    assert spans["rest-bin"]["code"] == "OK" and spans["rest-mixed"]["batch_size"] >= 2
    for rid, code in [
        ("e-model", "NOT_FOUND"),
        ("e-type", "INVALID_ARGUMENT"),
        ("e-size", "RESOURCE_EXHAUSTED"),
    ]:
        assert spans[rid]["code"] == code


@pytest.mark.parametrize("model", ["tabular", "image"])
def test_rest_feature_and_image_models_answer_as_grpc_does(start_server: Any, model: str) -> None:
    options = ("--handler-option", "size=64") if model == "image" else ()
    server = start_server("--model", model, "--workers", "0", "--http-port", "0", *options)
    port = http_port(server)
    if model == "tabular":
        rows = [tabular_features(RNG, 64) for _ in range(3)]
        grpc_items = [pb.Input(features=r) for r in rows]
        as_json = {"name": "INPUT", "datatype": "FP32", "shape": [3, 64], "data": rows}
        raw = np.asarray(rows, dtype="<f4").tobytes()
        as_binary = {**as_json, "parameters": {"binary_data_size": len(raw)}}
        del as_binary["data"]
        answers = [
            infer(port, {"inputs": [as_json]}, model=model, x_request_id="tab-json"),
            infer(port, {"inputs": [as_binary]}, raw, model=model, x_request_id="tab-bin"),
        ]
        ids = ["tab-json", "tab-bin"]
        bad = {"name": "INPUT", "datatype": "FP32", "shape": [1, 63], "data": [0.5] * 63}
        bad_message = "rows of 64 features expected"
    else:
        jpegs = [synthetic_jpeg(RNG, 3000) for _ in range(3)]
        grpc_items = [pb.Input(data=j) for j in jpegs]
        tensor, raw = bytes_tensor(jpegs, binary=True)
        answers = [infer(port, {"inputs": [tensor], "parameters": {"binary_data_output": True}}, raw,
                         model=model, x_request_id="img-bin")]  # fmt: skip
        ids = ["img-bin"]
        bad = {"name": "INPUT", "datatype": "BYTES", "shape": [1], "data": ["not a jpeg"]}
        bad_message = "image"
    expected = server.stub().Infer(pb.InferRequest(inputs=grpc_items), timeout=TIMEOUT_S).outputs
    for (status, headers, body), rid in zip(answers, ids, strict=True):
        assert status == 200, body
        _, out = outputs_of(headers, body)
        assert out["LABEL"].tolist() == [o.label for o in expected]  # deterministic: gRPC's answer
        assert np.allclose(out["SCORE"], [o.score for o in expected], rtol=1e-5)
        assert ((out["SCORE"] > 0) & (out["SCORE"] <= 1)).all()
        check_timing(headers, rid, 3)
    check_error(infer(port, {"inputs": [bad]}, model=model, x_request_id=f"{model}-bad"),
                400, "INVALID_ARGUMENT", bad_message, f"{model}-bad", batched=model == "image")  # fmt: skip


@pytest.mark.slow
def test_rest_not_ready_is_503_until_warm(start_server: Any) -> None:
    """Health, model readiness and inference answer 503 while the model loads (load_ms), then 200."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "load_ms=5000", "--workers", "0",
        "--http-port", "0", wait=False,
    )  # fmt: skip
    server.wait_ports()
    port = http_port(server)
    assert call(port, "GET", "/v2/health/live")[0] == 200
    assert call(port, "GET", "/v2/health/ready")[::2] == (503, b'{"ready":false}')
    assert call(port, "GET", "/v2/models/slow/ready")[0] == 503
    good, _ = bytes_tensor([b"abc"], binary=False)
    check_error(infer(port, {"inputs": [good]}, model="slow", x_request_id="early"),
                503, "UNAVAILABLE", "loading", "early")  # fmt: skip
    server.wait_serving()
    assert call(port, "GET", "/v2/health/ready")[0] == 200
    status, headers, body = infer(port, {"inputs": [good]}, model="slow", x_request_id="warm")
    assert status == 200 and outputs_of(headers, body)[1]["LABEL"].tolist() == [3]


def test_tritonclient_http(start_server: Any) -> None:
    """Triton's own HTTP client: readiness, metadata, binary and JSON tensors, a request id, errors."""
    th = pytest.importorskip("tritonclient.http", reason="tritonclient.http needs geventhttpclient")
    from tritonclient.utils import InferenceServerException

    server = start_server("--model", "null", "--workers", "0", "--http-port", "0")
    client = th.InferenceServerClient(url=f"{HOST}:{http_port(server)}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("null") and not client.is_model_ready("resnet50")
        assert client.get_model_metadata("null")["inputs"][0]["datatype"] == "BYTES"
        for binary in (True, False):
            inp = th.InferInput("INPUT", [3], "BYTES")
            inp.set_data_from_numpy(np.array([b"abcd", b"e", b"fg"], dtype=np.object_), binary_data=binary)
            outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("LABEL", "SCORE")]
            result = client.infer("null", [inp], outputs=outs, request_id=f"tc-{binary}")
            assert result.as_numpy("LABEL").tolist() == [4, 1, 2]
            assert result.get_response()["id"] == f"tc-{binary}"
        zipped = client.infer("null", [inp], request_compression_algorithm="gzip")  # Content-Encoding
        assert zipped.as_numpy("LABEL").tolist() == [4, 1, 2]
        wrong = th.InferInput("INPUT", [1], "INT32")
        wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
        with pytest.raises(InferenceServerException) as err:
            client.infer("null", [wrong])
        assert err.value.status() == "400" and "INT32" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.infer("resnet50", [inp])
        assert err.value.status() == "404"
    finally:
        client.close()


@pytest.mark.slow
def test_rest_with_workers_every_frontend_serves_the_port(start_server: Any) -> None:
    """--workers 2: both frontends listen on the one REST port (SO_REUSEPORT), as on gRPC's."""
    server = start_server("--model", "null", "--workers", "2", "--http-port", "0")
    port = http_port(server)
    assert call(port, "GET", "/v2/health/ready")[0] == 200
    for i in range(24):  # a fresh connection each: the kernel spreads them over both frontends
        tensor, raw = bytes_tensor([b"ab", b"cde"], binary=i % 2 == 1)
        status, headers, body = infer(port, {"inputs": [tensor]}, raw, x_request_id=f"w-{i}")
        assert status == 200, body
        assert outputs_of(headers, body)[1]["LABEL"].tolist() == [2, 3]
        check_timing(headers, f"w-{i}", 2)
    check_error(infer(port, {"inputs": [{**tensor, "shape": [300]}]}, raw, x_request_id="w-big"),
                400, "INVALID_ARGUMENT", "over the limit", "w-big")  # fmt: skip
    server.terminate()
    spans = [s for s in server.span_lines() if s["id"].startswith("w-")]
    assert len(spans) == 25 and sum(s["code"] == "OK" for s in spans) == 24
    assert len({s["pid"] for s in spans}) == 2, "both frontends answered"


@pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
def test_a_busy_http_port_is_one_line(workers: str) -> None:
    """Either layout refuses a --http-port that another program listens on, before loading a model."""
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_netgain(
            "serve", "--model", "null", "--port", "0", "--metrics-port", "-1", "--workers", workers,
            "--http-port", str(port), timeout=60.0,
        )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert f"--http-port {port}: {HOST}:{port} is already in use" in res.stderr
