"""`netgain load --protocol http-json` against a real HTTP JSON service (tests/http_app.py, aiohttp, in
its own process): every scheduled request gets a row and reaches the service with its request id,
the service's ``Server-Timing`` phases feed the report's tail attribution, failures keep their
HTTP status, code and reason, and a target that cannot be loaded fails before any load in one line.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HOST, TESTS_DIR, run_netgain, server_env
from http_helpers import (
    LOAD_FLAGS,
    App,
    load_http_json,
    one_row_each,
    report_blames_kernel,
    serve_app,
    write_template,
)

pytestmark = pytest.mark.slow

APP = TESTS_DIR / "http_app.py"


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    pytest.importorskip("aiohttp")
    with serve_app(APP) as served:
        yield served


def test_json_endpoint_with_server_timing(app: App, tmp_path: Path) -> None:
    before = app.get("/count").get("predict", 0)
    template = write_template(
        tmp_path,
        path="/predict",
        headers={"Authorization": "Bearer secret-token"},
        body={"image": "{payload_b64}"},
        ready_path="/health",
    )
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template)
    assert load.returncode == 0, load.stderr + load.stdout
    meta, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {"OK"} and set(rows["http_status"].tolist()) == {200}
    assert all(e is None for e in rows["error"])
    # The service answered each request once, and saw each one's id (the join key with its spans).
    assert app.get("/count")["predict"] - before == len(rows["index"])
    assert set(rows["request_id"].tolist()) <= set(app.get("/ids"))
    latency, service = rows["done_ns"] - rows["scheduled_ns"], rows["done_ns"] - rows["sent_ns"]
    assert (service > 0).all() and (latency >= service).all()
    kernel = rows["kernel_ms"].astype(float)
    assert not np.isnan(kernel).any()  # every answer's Server-Timing was read
    slow = rows["index"] % 20 == 0  # the app sleeps 40 ms in "kernel" for these
    assert (kernel[slow] >= 40.0).all() and (kernel[~slow] < 40.0).all()
    assert (rows["server_total_ms"] >= rows["kernel_ms"]).all()
    cfg = meta["config"]
    assert cfg["protocol"] == "http-json" and cfg["request_template"]["path"] == "/predict"
    assert cfg["request_template"]["headers"]["Authorization"] == "<redacted>"
    assert "secret-token" not in (out / "meta.json").read_text()
    assert meta["versions"]["client"]["geventhttpclient"]

    gaps = report_blames_kernel(out)["attribution_gaps"]
    assert any(g.startswith("an HTTP JSON run reads no ServerInfo") for g in gaps)


def test_feature_rows_with_several_items(app: App, tmp_path: Path) -> None:
    template = write_template(tmp_path, path="/rows", body={"rows": "{features_rows}"})
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template, "--items", "1:0.5,3:0.5", model="tabular")
    assert load.returncode == 0, load.stderr + load.stdout
    _, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {"OK"} and set(rows["items"].tolist()) == {1, 3}
    assert np.isnan(rows["server_total_ms"].astype(float)).all()  # /rows sends no Server-Timing


@pytest.mark.parametrize(
    ("path", "code", "http_status", "reason"),
    [
        ("/fail", "INTERNAL", 500, "HTTP 500: the model failed on purpose"),
        ("/no-such-path", "NOT_FOUND", 404, "HTTP 404: 404: Not Found"),
    ],
)
def test_failures_keep_their_status_and_reason(
    app: App, tmp_path: Path, path: str, code: str, http_status: int, reason: str
) -> None:
    template = write_template(tmp_path, path=path, body={"image": "{payload_b64}"})
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template)
    assert load.returncode == 5, load.stderr + load.stdout
    meta, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {code}
    assert set(rows["http_status"].tolist()) == {http_status}
    assert set(rows["error"].tolist()) == {reason}
    assert (rows["response_bytes"] == 0).all()
    n = len(rows["status"])
    assert meta["counts"]["errors"] == n and meta["validity"]["valid"] is True
    last = load.stdout.strip().splitlines()[-1]
    assert last.startswith("netgain load: REQUESTS FAILED") and last.endswith(f"{code}); none succeeded")


def test_answers_past_the_deadline(app: App, tmp_path: Path) -> None:
    """Answers slower than --timeout-s are DEADLINE_EXCEEDED, ended at the deadline."""
    template = write_template(tmp_path, path="/slow", body={"image": "{payload_b64}"})
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template, "--timeout-s", "0.3")
    assert load.returncode == 5, load.stderr + load.stdout
    _, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {"DEADLINE_EXCEEDED"}
    assert set(rows["error"].tolist()) == {"no response within 0.3 s"}
    service_s = (rows["done_ns"] - rows["sent_ns"]) / 1e9
    assert (service_s >= 0.3).all() and (service_s < 1.5).all()  # ended by the deadline, not the answer


def test_a_target_that_goes_away(tmp_path: Path) -> None:
    """The service dies mid-run: the requests after it are UNAVAILABLE, each with a row, and the
    run ends with TARGET WENT AWAY (exit 5), as a gRPC run does."""
    app_cmd = [sys.executable, str(APP), "--max-seconds", "120"]
    proc = subprocess.Popen(app_cmd, stdout=subprocess.PIPE, text=True, env=server_env())
    assert proc.stdout is not None
    doomed = App(proc, int(proc.stdout.readline().split()[1]))
    template = write_template(tmp_path, path="/predict", body={"image": "{payload_b64}"})
    out = tmp_path / "run"
    cmd = ["load", "--target", doomed.target, "--protocol", "http-json", "--request-template", template,
           "--model", "image", "--out", str(out), *LOAD_FLAGS, "--duration", "4"]  # fmt: skip
    from conftest import netgain_cmd

    load = subprocess.Popen(netgain_cmd(*cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=server_env())  # fmt: skip
    try:
        deadline = time.monotonic() + 60.0
        while doomed.get("/count").get("predict", 0) < 20:  # killed once it has served some
            assert load.poll() is None and time.monotonic() < deadline, "the load ended before 20 answers"
            time.sleep(0.05)
        proc.kill()
        proc.wait(10.0)
        stdout, stderr = load.communicate(timeout=120.0)
    finally:
        for p in (proc, load):
            if p.poll() is None:
                p.kill()
                p.wait(10.0)
    assert load.returncode == 5, stderr + stdout
    _, rows = one_row_each(out)
    status = rows["status"].tolist()
    # the service counted 20 before it was killed; the last of them may have died unanswered
    assert status.count("OK") >= 18 and status.count("UNAVAILABLE") > len(status) // 2
    assert set(status) <= {"OK", "UNAVAILABLE"}
    gone = rows["error"][rows["status"] == "UNAVAILABLE"]
    assert set(gone) <= {"connection refused"} | {e for e in gone if e.startswith("connection closed")}
    assert "TARGET WENT AWAY" in stdout.strip().splitlines()[-1]


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _fails_at_start(load: Any, out: Path, *phrases: str) -> None:
    assert load.returncode == 2, load.stderr + load.stdout
    last = load.stderr.strip().splitlines()[-1]
    assert last.startswith("netgain load: error: "), load.stderr
    for phrase in phrases:
        assert phrase in last, last
    assert not (out / "meta.json").exists() and not (out / "requests.parquet").exists()


def test_targets_that_cannot_be_loaded_fail_in_one_line(tmp_path: Path) -> None:
    template = write_template(tmp_path, path="/predict", body={"image": "{payload_b64}"})
    out = tmp_path / "run"
    port = _refused_port()
    for protocol in ("http-json", "oip-http"):
        flags = ["--request-template", template] if protocol == "http-json" else ["--oip-model", "null"]
        load = run_netgain(
            "load", "--target", f"{HOST}:{port}", "--protocol", protocol, "--model", "image", *flags,
            "--out", str(out), *LOAD_FLAGS,
        )  # fmt: skip
        _fails_at_start(load, out, f"target {HOST}:{port} refused the connection")

    import grpc

    bare = grpc.server(futures.ThreadPoolExecutor(1))  # a port that answers in HTTP/2, not HTTP/1.1
    grpc_port = bare.add_insecure_port(f"{HOST}:0")
    bare.start()
    try:
        load = load_http_json(f"{HOST}:{grpc_port}", out, template, "--wait-ready-s", "5")
    finally:
        bare.stop(0)
    _fails_at_start(load, out, f"target {HOST}:{grpc_port} is not an HTTP/1.1 server", "HTTP port")

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"path": "/predict", "body": {"rows": "{features_rows}"}}))
    load = load_http_json(f"{HOST}:{port}", out, str(bad))
    _fails_at_start(load, out, "--request-template", "{features_rows}", "payloads are bytes")


def test_ready_path_is_waited_for(app: App, tmp_path: Path) -> None:
    template = write_template(
        tmp_path, path="/predict", body={"image": "{payload_b64}"}, ready_path="/not-ready"
    )
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template, "--wait-ready-s", "1")
    _fails_at_start(load, out, f"target {app.target} is not ready", "GET /not-ready HTTP 404")
