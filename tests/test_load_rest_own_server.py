"""`netgain load --protocol oip-http` against `netgain serve --http-port`: the server's own KServe v2
REST endpoint, its per-request phases (the ``server-timing`` header) joined with each client row and
with the server's span log, and the report's tail attribution built from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HOST, read_meta, read_rows, run_netgain

from netgain.contract.phases import PHASES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", ["0", "2"])
def test_oip_http_load_on_the_servers_own_rest_endpoint_joins_every_phase(
    start_server: Any, tmp_path: Path, workers: str
) -> None:
    s = start_server(
        "--model", "image", "--handler-option", "size=64", "--http-port", "0", "--workers", workers
    )
    port = int(json.loads(s.ports_file.read_text())["http"])
    out = tmp_path / "run"
    load = run_netgain(
        "load", "--target", f"{HOST}:{port}", "--protocol", "oip-http", "--model", "image",
        "--rate", "40", "--duration", "2.5", "--warmup-s", "1", "--arrival", "constant",
        "--max-send-lag-ms", "200", "--timeout-s", "10", "--quiet", "--out", str(out),
    )  # fmt: skip
    assert load.returncode == 0, load.stderr + load.stdout
    meta, rows = read_meta(out), read_rows(out)
    n = meta["counts"]["scheduled"]
    assert n > 0 and sorted(rows["index"].tolist()) == list(range(n))  # one row per scheduled request
    assert set(rows["status"].tolist()) == {"OK"} and set(rows["http_status"].tolist()) == {200}
    for phase in PHASES:  # every answer's server-timing header was read
        assert not np.isnan(rows[f"{phase}_ms"].astype(float)).any(), phase
    parts = sum(rows[f"{p}_ms"].astype(float) for p in PHASES)
    total = rows["server_total_ms"].astype(float)
    assert (np.abs(parts - total) <= 0.02 * total + 0.01).all()
    assert (rows["done_ns"] - rows["sent_ns"] >= rows["server_total_ms"] * 1e6 * 0.99).all()
    # The same requests, by id, in the server's own span log.
    spans = {rec["id"] for rec in s.span_lines() if rec["code"] == "OK"}
    assert set(rows["request_id"].tolist()) <= spans

    report = run_netgain("report", str(out))
    assert report.returncode == 0, report.stderr + report.stdout
    summary = json.loads((out / "report.json").read_text())
    assert summary["tail"]["dominant"] in (*PHASES, "network", "send_lag", "other")
    assert not any("no server-timing trailer" in g for g in summary["attribution_gaps"])
