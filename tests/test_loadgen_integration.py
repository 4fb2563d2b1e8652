"""`netgain load` for real: a server process, a Locust master and worker processes, on 127.0.0.1."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest
from conftest import netgain_cmd, read_span_log, server_env
from conftest import read_meta as meta
from conftest import read_rows as rows
from conftest import run_netgain as netgain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def null_server(start_server_module: Any) -> Any:
    return start_server_module("--model", "null", "--max-batch-size", "16")


def test_open_loop_two_workers_one_row_per_scheduled_request(null_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = netgain(
        "load",
        "--target",
        null_server.target,
        "--rate",
        "100",
        "--duration",
        "3",
        "--warmup-s",
        "1",
        "--workers",
        "2",
        "--out",
        str(out),
        "--seed",
        "3",
        "--max-send-lag-ms",
        "50",
    )
    assert res.returncode == 0, res.stderr + res.stdout
    m = meta(out)
    r = rows(out)
    n = m["trace"]["requests"]
    assert len(r["index"]) == n == m["counts"]["scheduled"]
    assert sorted(r["index"].tolist()) == list(range(n))  # exactly one row each
    assert set(r["worker"].tolist()) == {0, 1}
    assert (r["status"] == "OK").all()
    latency = r["done_ns"] - r["scheduled_ns"]
    service = r["done_ns"] - r["sent_ns"]
    assert (latency >= service).all()  # latency counts from the intended time
    lag_ms = (r["sent_ns"] - r["scheduled_ns"]) / 1e6
    assert np.percentile(lag_ms, 50) < 5.0
    assert (r["server_total_ms"] > 0).all() and (service / 1e6 >= r["server_total_ms"] * 0.999).all()
    assert r["warmup"].sum() > 0 and (~r["warmup"]).sum() > 0
    assert m["validity"]["valid"] is True
    assert m["server"]["model"] == "null" and m["trace"]["digest"]
    # Locust's own statistics saw every request through the workers' request events.
    with open(out / "locust_stats.csv") as fh:
        stats = {row["Name"]: row for row in csv.DictReader(fh)}
    assert int(stats["Infer"]["Request Count"]) == n and int(stats["Infer"]["Failure Count"]) == 0
    # The same seed gives the same schedule digest, a different seed a different one.
    out2 = tmp_path / "run2"
    res2 = netgain(
        "load",
        "--target",
        null_server.target,
        "--rate",
        "100",
        "--duration",
        "1",
        "--warmup-s",
        "0",
        "--out",
        str(out2),
        "--seed",
        "4",
        "--quiet",
        "--max-send-lag-ms",
        "50",
    )
    assert res2.returncode == 0, res2.stderr
    assert meta(out2)["trace"]["digest"] != m["trace"]["digest"]
    samples = pq.read_table(out / "samples.parquet").to_pydict()
    assert "netgain_queue_depth_requests" in samples["metric"]
    assert "netgain_client_worker_cpu_ratio" in samples["metric"]
    # The aggregator reads the real run directory.
    rep = netgain("report", str(out), "--price-per-hour", "1.0")
    assert rep.returncode == 0, rep.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == 1 and report["valid"] is True
    assert report["throughput_rps"] > 50
    # The host's CPU, read beside the server's: the server shares the load generator's host here.
    for metric in ("host_cpu_seconds_total", "host_cpu_cores", "loadgen_cpu_seconds_total"):
        assert f"netgain_{metric}" in samples["metric"], metric
    host = report["cpu"]["host"]
    assert host["same_host"] is True and host["cores"] == os.cpu_count()
    assert host["busy"] > 0 and host["loadgen"] > 0 and host["server"] is not None and host["other"] >= 0


def test_slow_server_and_in_flight_cap_make_the_run_invalid(start_server: Any, tmp_path: Path) -> None:
    slow = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "forward_ms=200", "--max-batch-size", "1"
    )
    out = tmp_path / "slow"
    res = netgain(
        "load",
        "--target",
        slow.target,
        "--rate",
        "40",
        "--duration",
        "2",
        "--warmup-s",
        "0",
        "--max-in-flight",
        "3",
        "--out",
        str(out),
        "--quiet",
    )
    assert res.returncode == 3, res.stderr + res.stdout
    m = meta(out)
    assert m["validity"]["valid"] is False
    assert any("dropped" in reason for reason in m["validity"]["reasons"])
    r = rows(out)
    assert len(r["index"]) == m["trace"]["requests"]  # dropped requests keep their rows
    dropped = r["status"] == "DROPPED"
    assert dropped.sum() == m["counts"]["dropped"] > 0
    assert np.isnan(r["sent_ns"].astype(float)[dropped]).all() if r["sent_ns"].dtype == object else True
    assert "INVALID" in res.stdout


def test_closed_loop_mode(null_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "closed"
    res = netgain(
        "load",
        "--target",
        null_server.target,
        "--mode",
        "closed",
        "--concurrency",
        "4",
        "--duration",
        "2",
        "--warmup-s",
        "0",
        "--out",
        str(out),
        "--quiet",
        "--rate",
        "50",
    )
    assert res.returncode == 0, res.stderr + res.stdout
    r = rows(out)
    assert len(r["index"]) > 20
    assert len(set(r["index"].tolist())) == len(r["index"])
    assert (r["status"] == "OK").all()


def test_unreachable_target_fails_fast(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = netgain(
        "load",
        "--target",
        "127.0.0.1:1",
        "--duration",
        "1",
        "--out",
        str(tmp_path / "x"),
        "--wait-ready-s",
        "0",
    )
    assert res.returncode == 2
    assert time.monotonic() - t0 < 30
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not ready" in lines[0] and "Traceback" not in res.stderr


def test_payloads_that_cannot_be_made_fail_in_one_line(null_server: Any, tmp_path: Path) -> None:
    res = netgain(
        "load", "--target", null_server.target, "--model", "bogus", "--rate", "10", "--duration", "1",
        "--out", str(tmp_path / "run"), "--quiet",
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "a worker could not prepare its requests" in last and "unknown model 'bogus'" in last


def test_malformed_trace_names_file_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("t,size,items\n0.0,100,1\n0.5,abc,1\n")
    res = netgain(
        "load",
        "--target",
        "127.0.0.1:1",
        "--trace",
        str(trace),
        "--out",
        str(tmp_path / "x"),
        "--wait-ready-s",
        "0",
    )
    assert res.returncode == 2
    assert "bad.csv:3" in res.stderr and "size" in res.stderr and "Traceback" not in res.stderr


def test_killed_worker_marks_the_run_partial_and_keeps_every_row(null_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "partial"
    cmd = netgain_cmd(
        "load",
        "--target",
        null_server.target,
        "--rate",
        "100",
        "--duration",
        "6",
        "--warmup-s",
        "0",
        "--workers",
        "2",
        "--out",
        str(out),
        "--quiet",
        "--max-send-lag-ms",
        "50",
    )
    master = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=server_env(),
        stdin=subprocess.DEVNULL,
    )
    try:
        proc = psutil.Process(master.pid)
        deadline = time.monotonic() + 30
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline and len(workers) < 2:
            workers = [c for c in proc.children() if "netgain.loadgen.runner" in " ".join(c.cmdline())]
            time.sleep(0.1)
        assert len(workers) == 2
        time.sleep(3.0)  # let the run get going
        os.kill(workers[0].pid, signal.SIGKILL)
        _, stderr = master.communicate(timeout=90)
    finally:
        if master.poll() is None:
            master.kill()
    assert master.returncode == 3, stderr
    m = meta(out)
    assert m["workers"]["lost"] and m["validity"]["valid"] is False
    assert any("partial" in reason for reason in m["validity"]["reasons"])
    r = rows(out)
    assert sorted(r["index"].tolist()) == list(range(m["trace"]["requests"]))
    lost_worker = m["workers"]["lost"][0]
    other = r["worker"] != lost_worker
    assert (r["status"][other] == "OK").all()  # nothing of the surviving worker is lost
    lost_rows = r["status"][~other]
    assert {"WORKER_LOST", "NOT_SENT"} & set(lost_rows.tolist())
    counts = m["counts"]
    assert (
        counts["ok"] + counts["errors"] + counts["dropped"] + counts["not_sent"] + counts["worker_lost"]
        == counts["scheduled"]
    )


def test_connections_spread_load_over_frontend_processes(tmp_path: Path) -> None:
    """A server of two frontend processes on one port (SO_REUSEPORT): the kernel picks one per
    connection, so one connection loads one frontend and --connections 16 loads both (the span
    log names the process that answered each request)."""
    from netgain.experiments.orchestrate import ServerProcess

    spans = tmp_path / "spans.jsonl"
    args = ["--model", "null", "--workers", "2", "--span-log", str(spans)]
    with ServerProcess(args) as server:
        server.wait_ready()
        served: list[Any] = []
        for conns in ("1", "16"):
            seen = len(read_span_log(spans))
            out = tmp_path / f"c{conns}"
            res = netgain(
                "load", "--target", server.target, "--rate", "100", "--duration", "1",
                "--warmup-s", "0", "--connections", conns, "--out", str(out), "--quiet",
                "--max-send-lag-ms", "50",
            )  # fmt: skip
            assert res.returncode == 0, res.stderr
            assert (rows(out)["status"] == "OK").all()
            deadline = time.monotonic() + 10  # the span log is written every 50 ms
            n = meta(out)["trace"]["requests"]
            while len(read_span_log(spans)) - seen < n and time.monotonic() < deadline:
                time.sleep(0.05)
            lines = read_span_log(spans)[seen:]
            served.append((len({x["pid"] for x in lines}), len(lines), n))
    (one_pids, one_lines, n1), (many_pids, many_lines, n16) = served
    assert one_pids == 1 and one_lines == n1  # one connection: one frontend took everything
    assert many_pids == 2 and many_lines == n16
