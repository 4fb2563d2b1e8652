"""Faults during a run: the server killed and restarted under `netgain load`, and SIGTERM during
a burst. Killing a Locust worker is covered by
tests/test_loadgen_integration.py::test_killed_worker_marks_the_run_partial_and_keeps_every_row.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import netgain_cmd, read_meta, read_rows, server_env
from reliability_helpers import (
    REPO_ROOT,
    accounted,
    requests_by_code,
)

from netgain.protos import InferenceStub, pb

pytestmark = pytest.mark.slow

RATE, DURATION_S = 50, 14.0


def test_server_killed_and_restarted_during_a_run(start_server: Any, tmp_path: Path) -> None:
    first = start_server("--model", "null")
    port = first.grpc_port
    out = tmp_path / "run"
    cmd = netgain_cmd(
        "load",
        "--target",
        first.target,
        "--rate",
        str(RATE),
        "--duration",
        str(DURATION_S),
        "--warmup-s",
        "0",
        "--out",
        str(out),
        "--quiet",
        "--timeout-s",
        "5",
        "--max-send-lag-ms",
        "1000",
        "--seed",
        "5",
    )
    load = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=server_env(),
        stdin=subprocess.DEVNULL,
        cwd=REPO_ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while requests_by_code(first.metrics_text()).get("OK", 0) < 2 * RATE:  # ~2 s of the run served
            assert load.poll() is None and time.monotonic() < deadline, load.communicate()
            time.sleep(0.1)
        kill_ns = time.time_ns()
        first.proc.kill()  # SIGKILL: no drain, connections reset
        first.proc.wait(10)
        second = start_server("--model", "null", "--port", str(port))  # same port, new process
        ready_ns = time.time_ns()
        stdout, stderr = load.communicate(timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
    assert second.grpc_port == port
    assert load.returncode in (0, 3, 5), stderr + stdout  # 3: invalid; 5: requests failed
    meta = read_meta(out)
    counts = meta["counts"]
    rows = read_rows(out)
    # Every scheduled request has exactly one row, and the counts add up: nothing lost.
    assert sorted(rows["index"].tolist()) == list(range(counts["scheduled"]))
    assert accounted(counts) == counts["scheduled"] == len(rows["index"])
    status = rows["status"]
    errors = status != "OK"
    assert set(status[errors].tolist()) <= {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"}, set(status)
    assert (status == "UNAVAILABLE").sum() > 0
    # The error window: the failed requests were scheduled between the kill and a little after the
    # new server was ready (the client's channel reconnects with backoff); OK before and after.
    t_kill = (kill_ns - meta["epoch_unix_ns"]) / 1e9
    t_ready = (ready_ns - meta["epoch_unix_ns"]) / 1e9
    sched_s = rows["scheduled_ns"].astype(np.int64) / 1e9
    err_s = sched_s[errors]
    assert err_s.min() >= t_kill - 1.0 and err_s.max() <= t_ready + 3.0, (
        t_kill,
        t_ready,
        err_s.min(),
        err_s.max(),
    )
    ok_after = (status == "OK") & (sched_s > err_s.max())
    assert ok_after.sum() >= RATE, "the run did not recover after the restart"
    assert ((status == "OK") & (sched_s < t_kill)).sum() >= RATE
    # The report shows the window: its error counts match the rows.
    rep = subprocess.run(
        netgain_cmd("report", str(out)),
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert rep.returncode in (0, 3), rep.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["errors"].get("UNAVAILABLE", 0) == int((status == "UNAVAILABLE").sum())
    print(
        f"\nkill at {t_kill:.2f} s, ready again at {t_ready:.2f} s (down {t_ready - t_kill:.2f} s); "
        f"errors scheduled {err_s.min():.2f}..{err_s.max():.2f} s: {int(errors.sum())} rows "
        f"({dict(zip(*np.unique(status[errors], return_counts=True), strict=True))}); "
        f"scheduled {counts['scheduled']}, ok {counts['ok']}, lost 0"
    )


def test_sigterm_during_a_burst_finishes_in_flight_and_flushes(start_server: Any) -> None:
    n = 24
    server = start_server(
        "--model",
        "conftest:SlowHandler",
        "--handler-option",
        "forward_ms=100",
        "--max-batch-size",
        "4",
        "--max-queue-size",
        "64",
    )
    stub = server.stub()
    ids = [f"burst-{i:03d}" for i in range(n)]
    futures = [
        stub.Infer.future(
            pb.InferRequest(inputs=[pb.Input(data=b"abc")]), metadata=(("x-request-id", rid),), timeout=30.0
        )
        for rid in ids
    ]
    deadline = time.monotonic() + 10
    while True:  # all n accepted by the server (queued or in a batch), most not yet done
        text = server.metrics_text()
        in_flight = [ln for ln in text.splitlines() if ln.startswith("netgain_in_flight_requests{")]
        if in_flight and float(in_flight[0].split()[-1]) >= n - 4:
            break
        assert time.monotonic() < deadline, "the burst never reached the server"
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    t_term = time.monotonic()
    # A request arriving once the server has the signal (it says "draining") is refused, not queued.
    while "draining" not in server.stdout():
        assert time.monotonic() - t_term < 10, "no 'draining' within 10 s of SIGTERM"
        time.sleep(0.01)
    late = grpc.insecure_channel(server.target)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            InferenceStub(late).Infer(pb.InferRequest(inputs=[pb.Input(data=b"late")]), timeout=5.0)
        # UNAVAILABLE, which clients retry: not CANCELLED, as gRPC's stop would answer a call it had taken
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    finally:
        late.close()
    results = [f.result(timeout=30) for f in futures]  # raises if any failed
    assert all(len(r.outputs) == 1 for r in results)
    rc = server.proc.wait(30)
    assert rc == 0, server.output()
    drain_s = time.monotonic() - t_term
    out = server.stdout()
    assert "draining" in out and "stopped" in out
    spans = {s["id"]: s for s in server.span_lines()}
    assert set(ids) <= set(spans), sorted(set(ids) - set(spans))  # flushed on shutdown
    assert all(spans[i]["code"] == "OK" for i in ids)
    print(
        f"\nSIGTERM with {n} requests in flight: {n} OK, {len(spans)} span lines, exit {rc}, "
        f"drained in {drain_s:.2f} s"
    )
