"""Regressions in `netgain load`: closed loop at the epoch, error counts, the web UI, bound ports.

Real processes on 127.0.0.1: a null server and `netgain load` with one local worker."""

from __future__ import annotations

import io
import json
import queue
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import netgain_cmd, server_env
from conftest import read_meta as meta
from conftest import read_rows as rows
from conftest import run_netgain as netgain

from netgain.contract.records import RECORD_COLUMNS, empty_columns
from netgain.loadgen.runner.live import LiveStats
from netgain.loadgen.runner.wire import records_batch

RUN_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def null_server(start_server_module: Any) -> Any:
    return start_server_module("--model", "null", "--device", "cpu")


@pytest.mark.slow
def test_closed_loop_starts_at_the_epoch_and_errors_are_not_negative(
    null_server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "closed"
    res = netgain(
        "load", "--target", null_server.target, "--mode", "closed", "--concurrency", "4",
        "--duration", "2", "--warmup-s", "0", "--out", str(out), "--quiet",
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    r = rows(out)
    assert len(r["index"]) > 20
    assert (r["scheduled_ns"] >= 0).all() and (r["sent_ns"] >= 0).all()  # nothing before the epoch
    assert (r["done_ns"] <= 2e9 + 10e9).all()  # within duration + request timeout
    counts = meta(out)["counts"]
    not_ok = int((r["status"] != "OK").sum())
    assert counts["errors"] == not_ok == 0
    assert counts["ok"] == counts["answered"] == counts["rows"] == len(r["index"])
    assert f"ok {len(r['index'])} errors 0 dropped 0" in res.stdout


def _row(i: int, done_ns: int | None, status: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(RECORD_COLUMNS)
    row.update(
        index=i, request_id=f"r-{i}", worker=0, target="t", warmup=False, scheduled_ns=-500_000_000 + i,
        sent_ns=None if done_ns is None else -499_000_000 + i, done_ns=done_ns, status=status,
        items=1, request_bytes=3, response_bytes=0,
    )  # fmt: skip
    return row


def test_answered_is_a_done_time_whatever_its_sign() -> None:
    rows_ = [
        _row(0, -400_000_000, "OK"),  # answered before the epoch: still answered
        _row(1, -300_000_000, "OK"),
        _row(2, 1_000_000, "UNAVAILABLE"),
        _row(3, -200_000_000, "DEADLINE_EXCEEDED"),
        _row(4, None, "DROPPED"),
        _row(5, None, "OK"),  # no done time: not answered, so not counted OK either
    ]
    cols = empty_columns()
    for row in rows_:
        for c in RECORD_COLUMNS:
            cols[c].append(row[c])
    live = LiveStats(None, out=io.StringIO())
    live.add(records_batch(cols))
    assert (live.sent, live.ok, live.errors, live.dropped) == (4, 2, 2, 1)
    assert live.latency.total == 2  # latency counts successful requests, as the report's p99 does


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        return int(resp.status), bytes(resp.read())


@pytest.mark.slow
def test_web_ui_serves_during_a_run(null_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "web"
    cmd = netgain_cmd(
        "load", "--target", null_server.target, "--rate", "50", "--duration", "2", "--warmup-s", "0",
        "--out", str(out), "--web-ui", "--web-port", "0", "--max-send-lag-ms", "50",
    )  # fmt: skip
    stdout_path = tmp_path / "stdout.txt"
    with open(stdout_path, "w") as stdout_fh:  # a file: only the pump thread reads a pipe
        proc = subprocess.Popen(
            cmd,
            stdout=stdout_fh,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=server_env(),
        )
    lines: queue.Queue[str | None] = queue.Queue()
    err: list[str] = []

    def pump() -> None:  # stderr read on a thread, so the test's wait stays bounded
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        url = None
        deadline = time.monotonic() + 60.0
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if m := re.search(r"web UI on (http://127\.0\.0\.1:(\d+)/)", line):
                url = m.group(1)
        assert url is not None, "no web UI line: " + "".join(err)
        # The page is built on each GET from Locust's flags, as during the run's creation.
        status, body = _get(url)
        assert status == 200 and b"<html" in body.lower()
        status, body = _get(url + "stats/requests")
        assert status == 200 and "stats" in json.loads(body)
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10.0)  # stderr hits end of file once the process is gone
    assert proc.returncode == 0, "".join(err) + stdout_path.read_text()
    r = rows(out)
    assert len(r["index"]) > 50 and (r["status"] == "OK").all()
    m = meta(out)
    assert m["config"]["web_port"] == int(url.rsplit(":", 1)[1].rstrip("/"))
    assert m["config"]["web_port_requested"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--web-ui", "--web-port"], ["--metrics-port"]])
def test_a_taken_port_fails_in_one_line(null_server: Any, tmp_path: Path, flags: list[str]) -> None:
    taken = str(null_server.grpc_port)
    res = netgain(
        "load", "--target", null_server.target, "--duration", "1", "--warmup-s", "0",
        "--out", str(tmp_path / "run"), *flags, taken, "--quiet",
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert f"{flags[0]}: cannot serve on 127.0.0.1:{taken}: Address already in use" in lines[0]


@pytest.mark.slow
def test_metrics_port_zero_records_the_bound_port(null_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "metrics"
    res = netgain(
        "load", "--target", null_server.target, "--rate", "50", "--duration", "1", "--warmup-s", "0",
        "--out", str(out), "--metrics-port", "0", "--quiet", "--max-send-lag-ms", "50",
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    assert "client metrics on" not in res.stderr  # --quiet hides the line: meta.json has the port
    config = meta(out)["config"]
    assert config["metrics_port_requested"] == 0
    assert 0 < config["metrics_port"] < 65536
    assert config["web_port"] == -1  # not served
