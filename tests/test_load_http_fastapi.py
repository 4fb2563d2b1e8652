"""`netgain load --protocol http-json` against a real FastAPI service under uvicorn
(tests/fastapi_app.py, in its own process): every scheduled request gets a row and reaches the service
with its request id, the ``Server-Timing`` a FastAPI middleware writes feeds the report's tail
attribution, and FastAPI's refusals keep their HTTP status and ``detail``.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTS_DIR
from http_helpers import App, load_http_json, one_row_each, report_blames_kernel, serve_app, write_template
from PIL import Image

from netgain.contract.phases import parse_server_timing

pytestmark = pytest.mark.slow

APP = TESTS_DIR / "fastapi_app.py"


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    with serve_app(APP) as served:
        yield served


def _post_jpeg(app: App, request_id: str) -> tuple[int, dict[str, str], dict[str, int]]:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(buf, "JPEG")
    body = json.dumps({"image": base64.b64encode(buf.getvalue()).decode()}).encode()
    headers = {"Content-Type": "application/json", "x-request-id": request_id}
    req = urllib.request.Request(f"http://{app.target}/predict", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=5.0) as resp:
        return resp.status, dict(resp.headers), json.loads(resp.read())


def test_fastapi_predict_with_server_timing(app: App, tmp_path: Path) -> None:
    # One request by hand first: the service decodes the JPEG, echoes the id and times its phases.
    status, headers, answer = _post_jpeg(app, "by-hand-20")
    assert status == 200 and answer["width"] == 8 and answer["height"] == 6
    assert headers["x-request-id"] == "by-hand-20"
    by_hand = parse_server_timing(headers["server-timing"])
    assert {"queue", "pre", "kernel", "post", "total"} <= set(by_hand) and by_hand["kernel"] >= 40.0

    before = app.get("/count")["predict"]
    body = {"image": "{payload_b64}"}
    template = write_template(tmp_path, path="/predict", body=body, ready_path="/health")
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template)
    assert load.returncode == 0, load.stderr + load.stdout
    meta, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {"OK"} and set(rows["http_status"].tolist()) == {200}
    assert all(e is None for e in rows["error"])
    assert (rows["response_bytes"] > 0).all()
    # The service answered each request once, and saw each one's id.
    assert app.get("/count")["predict"] - before == len(rows["index"])
    assert set(rows["request_id"].tolist()) <= set(app.get("/ids"))
    kernel = rows["kernel_ms"].astype(float)
    assert not np.isnan(kernel).any()  # every answer's Server-Timing was read
    for phase in ("queue_ms", "pre_ms", "post_ms"):
        assert not np.isnan(rows[phase].astype(float)).any(), phase
    slow = rows["index"] % 20 == 0  # the app sleeps 40 ms in "kernel" for these
    assert (kernel[slow] >= 40.0).all() and (kernel[~slow] < 40.0).all()
    assert (rows["server_total_ms"] >= rows["kernel_ms"]).all()
    assert meta["config"]["protocol"] == "http-json"

    report_blames_kernel(out)


def test_fastapi_refuses_what_is_not_a_jpeg(app: App, tmp_path: Path) -> None:
    """Text payloads decode but are no JPEG: 415 with FastAPI's ``detail``, INVALID_ARGUMENT."""
    template = write_template(tmp_path, path="/predict", body={"image": "{payload_b64}"})
    out = tmp_path / "run"
    load = load_http_json(app.target, out, template, model="text")
    assert load.returncode == 5, load.stderr + load.stdout
    _, rows = one_row_each(out)
    assert set(rows["status"].tolist()) == {"INVALID_ARGUMENT"}
    assert set(rows["http_status"].tolist()) == {415}
    errors = rows["error"].tolist()
    assert all(e.startswith("HTTP 415: image is not a JPEG (unknown format, ") for e in errors), errors[:3]
    assert np.isnan(rows["kernel_ms"].astype(float)).all()  # refused before its kernel ran
