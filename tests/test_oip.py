"""The Open Inference Protocol (KServe v2 gRPC) served by `netgain serve`, checked with Triton's own
client (tritonclient[grpc]): readiness, metadata, inference on each built-in model, errors, and the
netgain trailers and span log that the same request path gives both protocols."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from netgain.contract.payloads import null_bytes, synthetic_jpeg, tabular_features, text_bytes
from netgain.contract.phases import PHASES, REQUEST_ID_KEY, TIMING_KEY, parse_trailer
from netgain.protos import oip_pb2
from netgain.server.oip import BadTensor, ModelIO, split_bytes, to_inputs

try:
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException
except ImportError as exc:  # pragma: no cover - CI installs it (.[dev])
    tc = None
    _skip = f"tritonclient[grpc] cannot be imported ({exc}); pip install -e '.[dev]'"
else:
    _skip = ""

needs_triton = pytest.mark.skipif(tc is None, reason=_skip or "tritonclient present")

RNG = random.Random(7)
PAYLOADS = {
    "image": lambda: synthetic_jpeg(RNG, 6000),
    "text": lambda: text_bytes(RNG),
    "null": lambda: null_bytes(RNG, 64),
}


def bytes_input(items: list[bytes]) -> Any:
    inp = tc.InferInput("INPUT", [len(items)], "BYTES")
    inp.set_data_from_numpy(np.array(items, dtype=np.object_))
    return inp


def features_input(rows: list[list[float]]) -> Any:
    inp = tc.InferInput("INPUT", [len(rows), len(rows[0])], "FP32")
    inp.set_data_from_numpy(np.array(rows, dtype=np.float32))
    return inp


def check_trailers(call: Any, request_id: str, items: int) -> None:
    trailers = dict(call.trailing_metadata())
    assert trailers[REQUEST_ID_KEY] == request_id
    phases, batch = parse_trailer(trailers[TIMING_KEY])
    assert set(PHASES) <= set(phases) and phases["total"] > 0
    assert batch is not None and batch[0] >= 0 and batch[1] >= items


@needs_triton
@pytest.mark.parametrize("model", ["image", "text", "tabular", "null"])
def test_tritonclient_metadata_readiness_inference_errors(start_server: Any, model: str) -> None:
    server = start_server("--model", model, "--max-batch-size", "8", "--workers", "0")
    client = tc.InferenceServerClient(url=server.target)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(model) and not client.is_model_ready("resnet50")
    meta = client.get_model_metadata(model, as_json=True)
    assert meta["name"] == model and meta["versions"] == ["1"]
    (inp,) = meta["inputs"]
    assert inp["name"] == "INPUT"
    assert [o["name"] for o in meta["outputs"]] == ["LABEL", "SCORE"]
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata("resnet50")
    assert "NOT_FOUND" in str(missing.value.status()) and "resnet50" in missing.value.message()

    # inference: a client-side batch of 3, ids through tritonclient's request_id
    if model == "tabular":
        assert inp["datatype"] == "FP32" and inp["shape"] == ["-1", "64"]
        good = features_input([tabular_features(RNG, 64) for _ in range(3)])
        bad = features_input([tabular_features(RNG, 63)])
        bad_message = "rows of 64 features expected"
    else:
        assert inp["datatype"] == "BYTES" and inp["shape"] == ["-1"]
        good = bytes_input([PAYLOADS[model]() for _ in range(3)])
        bad = bytes_input([b"\xff\xfe not a jpeg" if model == "image" else b"\xff\xfe\xfd"])
        bad_message = {"image": "image", "text": "UTF-8", "null": ""}[model]
    result = client.infer(model, [good], request_id=f"oip-{model}-1")
    labels, scores = result.as_numpy("LABEL"), result.as_numpy("SCORE")
    assert labels.shape == (3,) and labels.dtype == np.int64 and scores.dtype == np.float32
    if model != "null":
        assert ((scores > 0) & (scores <= 1)).all()
    assert result.get_response().id == f"oip-{model}-1"
    only = client.infer(model, [good], outputs=[tc.InferRequestedOutput("LABEL")])
    assert [o.name for o in only.get_response().outputs] == ["LABEL"]
    assert (only.as_numpy("LABEL") == labels).all()  # deterministic models, same items

    # errors: bad payload (the handler's message), wrong datatype, wrong name, unknown model
    if model != "null":  # the null model accepts any bytes
        with pytest.raises(InferenceServerException) as invalid:
            client.infer(model, [bad], request_id=f"oip-{model}-bad")
        assert "INVALID_ARGUMENT" in str(invalid.value.status())
        assert bad_message in invalid.value.message()
    wrong_type = tc.InferInput("INPUT", [1], "INT32")
    wrong_type.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as typed:
        client.infer(model, [wrong_type])
    assert "INVALID_ARGUMENT" in str(typed.value.status()) and "INT32" in typed.value.message()
    renamed = tc.InferInput("input_1", [1], "BYTES")
    renamed.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as named:
        client.infer(model, [renamed])
    assert "INVALID_ARGUMENT" in str(named.value.status()) and "'input_1'" in named.value.message()
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("resnet50", [good])
    assert "NOT_FOUND" in str(unknown.value.status())

    # trailers and x-request-id on OIP calls, success and failure, through Triton's own stubs
    stub = service_pb2_grpc.GRPCInferenceServiceStub(server.channel)
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT", datatype=good.datatype(), shape=good.shape())
    request.raw_input_contents.append(good._get_content())
    _, call = stub.ModelInfer.with_call(request, metadata=((REQUEST_ID_KEY, f"trailer-{model}"),))
    check_trailers(call, f"trailer-{model}", 3)
    tensor.datatype = "INT32"
    with pytest.raises(Exception) as failed:
        stub.ModelInfer(request, metadata=((REQUEST_ID_KEY, f"trailer-{model}-bad"),))
    assert dict(failed.value.trailing_metadata())[REQUEST_ID_KEY] == f"trailer-{model}-bad"

    # the span log and the counters see OIP requests like netgain.v1's
    server.terminate()
    spans = {s["id"]: s for s in server.span_lines()}
    assert spans[f"oip-{model}-1"]["code"] == "OK" and spans[f"oip-{model}-1"]["items"] == 3
    assert spans[f"trailer-{model}"]["code"] == "OK"
    assert spans[f"trailer-{model}-bad"]["code"] == "INVALID_ARGUMENT"


@needs_triton
@pytest.mark.slow
def test_tritonclient_against_workers(start_server: Any) -> None:
    """--workers 2: each frontend registers the OIP service through the same start_grpc."""
    server = start_server("--model", "null", "--workers", "2")
    clients = [tc.InferenceServerClient(url=server.target) for _ in range(4)]
    for i, client in enumerate(clients):
        assert client.is_model_ready("null")
        out = client.infer("null", [bytes_input([b"abc", b"de"])], request_id=f"w-{i}")
        assert out.as_numpy("LABEL").tolist() == [3, 2]  # the null model answers each item's length


@needs_triton
def test_both_descriptor_sets_import_in_one_process() -> None:
    """tritonclient registers inference.* in protobuf's default pool; netgain's copy is private."""
    assert service_pb2.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    ours = oip_pb2.ModelInferRequest(model_name="m", id="x")
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert (theirs.model_name, theirs.id) == ("m", "x")


def _request(datatype: str, shape: list[int], raw: bytes | None = None, **contents: Any) -> Any:
    req = oip_pb2.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="INPUT", datatype=datatype, shape=shape)
    for key, values in contents.items():
        getattr(t.contents, key).extend(values)
    if raw is not None:
        req.raw_input_contents.append(raw)
    return req


def test_tensor_conversion() -> None:
    raw = b"".join(len(b).to_bytes(4, "little") + b for b in (b"ab", b"", b"xyz"))
    assert split_bytes(raw) == [b"ab", b"", b"xyz"]
    with pytest.raises(BadTensor, match="malformed"):
        split_bytes(raw[:-1])
    with pytest.raises(BadTensor, match="malformed"):
        split_bytes(b"\x01\x00")
    bytes_io, feats_io = ModelIO("BYTES"), ModelIO("FP32", 2)
    assert [i.data for i in to_inputs(_request("BYTES", [3, 1], raw), bytes_io)] == [b"ab", b"", b"xyz"]
    assert [i.data for i in to_inputs(_request("BYTES", [1], bytes_contents=[b"q"]), bytes_io)] == [b"q"]
    with pytest.raises(BadTensor, match="holds more than the 2 elements of its shape"):
        to_inputs(_request("BYTES", [2], raw), bytes_io)
    with pytest.raises(BadTensor, match="holds 4 elements, the data 3"):
        to_inputs(_request("BYTES", [4], raw), bytes_io)
    with pytest.raises(BadTensor, match="both contents and raw_input_contents"):
        to_inputs(_request("BYTES", [3], raw, bytes_contents=[b"q"]), bytes_io)
    with pytest.raises(BadTensor, match="request has 9 inputs, over the limit of 8"):
        to_inputs(_request("BYTES", [9], bytes_contents=[b""] * 9), bytes_io, max_items=8)
    with pytest.raises(BadTensor, match="request has 9 inputs, over the limit of 8"):
        to_inputs(_request("FP32", [9, 2], fp32_contents=[0.0] * 18), feats_io, max_items=8)
    rows = np.arange(6, dtype="<f4")
    got = to_inputs(_request("FP32", [3, 2], rows.tobytes()), feats_io)
    assert [list(i.features) for i in got] == [[0, 1], [2, 3], [4, 5]]
    got = to_inputs(_request("FP32", [1, 2], fp32_contents=[1.5, 2.5]), feats_io)
    assert [list(i.features) for i in got] == [[1.5, 2.5]]
    with pytest.raises(BadTensor, match="24 bytes of FP32, the data 20"):
        to_inputs(_request("FP32", [3, 2], rows.tobytes()[:-4]), feats_io)
    with pytest.raises(BadTensor, match="negative"):
        to_inputs(_request("FP32", [-1, 2], rows.tobytes()), feats_io)
    with pytest.raises(BadTensor, match="takes one"):
        to_inputs(oip_pb2.ModelInferRequest(), bytes_io)


@pytest.mark.slow
@pytest.mark.parametrize("instrumented", [True, False])
def test_load_protocol_oip(start_server: Any, tmp_path: Any, instrumented: bool) -> None:
    """`netgain load --protocol oip` against a server read only through OIP (ModelMetadata gives the
    FP32 input); without netgain's trailers (--no-instrumentation sends none, as Triton) the report
    names the attributions it cannot make."""
    import json

    from conftest import read_rows, run_netgain

    extra = () if instrumented else ("--no-instrumentation",)
    server = start_server("--model", "tabular", "--workers", "0", *extra)
    out = tmp_path / "run"
    load = run_netgain(
        "load", "--target", server.target, "--protocol", "oip", "--oip-model", "tabular",
        "--rate", "20", "--duration", "2", "--out", str(out), "--quiet", "--max-send-lag-ms", "200",
    )  # fmt: skip
    assert load.returncode == 0, load.stderr
    rows = read_rows(out)
    assert set(rows["status"]) == {"OK"} and len(rows["status"]) >= 30
    timed = [v for v in rows["server_total_ms"] if v == v]  # not NaN
    assert len(timed) == (len(rows["status"]) if instrumented else 0)
    report = run_netgain("report", str(out))
    assert report.returncode == 0, report.stderr
    summary = json.loads((out / "report.json").read_text())
    gaps = next(iter(summary["runs"].values()))["attribution_gaps"] if "runs" in summary else None
    gaps = gaps if gaps is not None else summary.get("attribution_gaps", [])
    assert any("reads no ServerInfo" in g for g in gaps)
    assert any("no server-timing trailer" in g for g in gaps) == (not instrumented)
    if not instrumented:
        assert "no server-timing trailer" in report.stdout
    no_model = run_netgain("load", "--target", server.target, "--protocol", "oip", "--out", str(tmp_path))
    assert no_model.returncode == 2 and "--oip-model" in no_model.stderr


NETGAIN_SERVE_FLAGS = ("--max-queue-delay-ms", "--max-batch-size", "--workers", "--pre-threads", "--intra-op")


@pytest.mark.slow
def test_report_without_trailers_makes_no_server_claims(start_server: Any, tmp_path: Any) -> None:
    """A real `netgain load --protocol oip` against a server that sends no trailers (netgain serve
    --no-instrumentation, as Triton): the report gives no netgain serve advice, does not claim the
    server's layout, names no client-side phase as the tail's, and says which attributions it
    cannot make; with every request failing too (each past its deadline), the warnings stay."""
    import json

    from conftest import run_netgain

    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "forward_ms=100", "--max-batch-size", "1",
        "--workers", "0", "--no-instrumentation",
    )  # fmt: skip
    flags = (
        "--target", server.target, "--protocol", "oip", "--oip-model", "slow", "--model", "null",
        "--rate", "4", "--arrival", "constant", "--duration", "2", "--warmup-s", "0.5",
        "--max-send-lag-ms", "200", "--quiet",
    )  # fmt: skip
    for timeout_s, ok in (("10", True), ("0.02", False)):
        out = tmp_path / f"run-{ok}"
        load = run_netgain("load", *flags, "--timeout-s", timeout_s, "--out", str(out), timeout=90)
        assert load.returncode == (0 if ok else 5), load.stderr + load.stdout
        report = run_netgain("report", str(out), "--bootstrap", "0", timeout=90)
        assert report.returncode == 0, report.stderr + report.stdout
        r = json.loads((out / "report.json").read_text())
        failed = r["statuses"].get("DEADLINE_EXCEEDED", 0)
        assert (r["counts"]["ok"] > 0) == ok and failed == (0 if ok else r["counts"]["measured"]), r[
            "statuses"
        ]
        text = report.stdout + (out / "report.md").read_text()
        assert not [f for f in NETGAIN_SERVE_FLAGS if f in text], text
        assert "one process" not in text and "server: configuration unknown" in report.stdout
        assert r["server_config"] is None
        tail_line = next(ln for ln in report.stdout.splitlines() if ln.startswith("  tail (>= p99):"))
        assert r["tail"]["dominant"] is None and "send_lag" not in tail_line, tail_line
        bott = r["bottleneck"]
        assert bott["kind"] == "unknown" and [k["kind"] for k in bott["kinds"]] == ["unknown"], bott
        gaps = r["attribution_gaps"]
        which = "successful requests" if ok else "answered requests (none succeeded)"
        assert any(
            g.startswith("no server-timing trailer on ") and which in g and "queue, pre, h2d" in g
            for g in gaps
        ), gaps
        assert any(g.startswith("batch sizes are unknown without the trailer") for g in gaps), gaps
        assert any("server CPU" in g and "server's bottleneck kind cannot be named" in g for g in gaps), gaps
        for gap in gaps:
            assert f"warning: {gap}" in report.stdout


def test_attribution_gaps() -> None:
    from netgain.analysis.coverage import attribution_gaps

    nan = float("nan")
    assert attribution_gaps(np.array([1.0, 2.0]), {"config": {"protocol": "netgain"}}) == []
    lines = attribution_gaps(np.array([nan, 2.0]), {"config": {"protocol": "netgain"}})
    assert len(lines) == 2 and "1 of 2" in lines[0] and "batch sizes are unknown" in lines[1]
    meta = {"config": {"protocol": "oip"}, "server": {"versions": {"platform": "tensorrt_plan"}}}
    lines = attribution_gaps(np.array([nan, nan]), meta)
    assert "platform tensorrt_plan" in lines[0] and "bottleneck kind cannot be named" in lines[-1]
    # none succeeded: said from the answered requests, which carried no trailer either
    lines = attribution_gaps(np.array([]), meta, np.array([nan, nan, nan]))
    assert len(lines) == 3 and "on any of the 3 answered requests (none succeeded)" in lines[0]
    assert attribution_gaps(np.array([]), meta) == lines[-1:]  # nothing answered: the OIP line stays
    assert attribution_gaps(np.array([]), {"config": {"protocol": "netgain"}}, np.array([1.0, nan])) == []
