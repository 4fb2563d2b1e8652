"""Ctrl-C during `netgain load`: a SIGINT to the whole process group (as a terminal sends it) stops
the schedule, drains or cancels the requests in flight, writes every row and meta.json, and exits
130; `netgain report` reads the run as a partial one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import netgain_cmd, server_env
from conftest import read_meta as meta
from conftest import read_rows as rows
from conftest import run_netgain as netgain

pytestmark = pytest.mark.slow


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, path.read_text(errors="replace")
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not seen within {timeout_s} s: {path.read_text(errors='replace')}")


def test_ctrl_c_to_the_process_group_writes_every_row_and_an_interrupted_meta(
    start_server: Any, tmp_path: Path
) -> None:
    """SIGINT to the group of `netgain load` with two workers: exit 130, no traceback, one row per
    scheduled request (answered, CANCELLED after the drain, or NOT_SENT), meta.json marked
    interrupted, and a report that says PARTIAL RUN and INVALID."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "forward_ms=4000", "--max-batch-size", "4"
    )
    out = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as fh_err, open(tmp_path / "stdout.txt", "wb") as fh_out:
        proc = subprocess.Popen(
            netgain_cmd(
                "load",
                "--target",
                server.target,
                "--rate",
                "20",
                "--duration",
                "60",
                "--warmup-s",
                "0",
                "--workers",
                "2",
                "--out",
                str(out),
                "--max-send-lag-ms",
                "1000",
            ),
            stdout=fh_out,
            stderr=fh_err,
            stdin=subprocess.DEVNULL,
            env=server_env(),
            start_new_session=True,  # its own process group, as a shell job has
        )
        try:
            _wait_for(err, "requests scheduled over", proc, 120.0)
            _wait_for(err, "s/60s]", proc, 60.0)  # a progress line: requests are out
            _wait_for(err, "[   2.", proc, 60.0)
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    stderr = err.read_text(errors="replace")
    stdout = (tmp_path / "stdout.txt").read_text(errors="replace")
    assert rc == 130, stderr + stdout
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "PARTIAL RUN (interrupted)" in stdout
    m = meta(out)
    assert m["interrupted_at_s"] > 0
    assert m["validity"]["valid"] is False and "interrupted" in m["validity"]["reasons"][0]
    r = rows(out)
    n = m["trace"]["requests"]
    assert sorted(r["index"].tolist()) == list(range(n))  # every scheduled request has its one row
    statuses = set(r["status"].tolist())
    assert "NOT_SENT" in statuses  # the rest of the schedule was not sent
    assert "CANCELLED" in statuses  # a 4 s forward outlasts the drain: cancelled, with a status
    assert None not in statuses
    # The report reads it, as a partial run that is not evidence.
    rep = netgain("report", str(out))
    assert rep.returncode == 0, rep.stderr + rep.stdout
    assert "PARTIAL RUN (interrupted)" in rep.stdout and "INVALID" in rep.stdout
    # measured up to the Ctrl-C, and the requests it cut off are not reported as failures
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is True
    assert report["window_s"]["end"] == pytest.approx(m["interrupted_at_s"])
    assert "REQUESTS FAILED" not in rep.stdout and "TARGET WENT AWAY" not in rep.stdout
    # The next run needs a new --out (or --force), as after any finished run.
    again = netgain("load", "--target", server.target, "--out", str(out))
    assert again.returncode == 2 and "already holds a run" in again.stderr
