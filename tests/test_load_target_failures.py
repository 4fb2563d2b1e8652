"""`netgain load` against a target that fails: every request failing exits 5 (the target failed,
not an invalid measurement), a failed probe leaves no run behind (the same --out works again without
--force), and an Open Inference Protocol model the ready server does not know fails at once.

Real `netgain serve` and `netgain load` processes on 127.0.0.1, port 0, every wait bounded."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import HOST, read_meta, read_rows, run_netgain

pytestmark = pytest.mark.slow

QUICK = ("--arrival", "constant", "--warmup-s", "0", "--duration", "1", "--max-send-lag-ms", "200")


def _closed_port() -> int:
    """A loopback port nothing listens on: bound (port 0), read, closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, text
    return lines[-1]


def test_every_request_failing_exits_5_and_the_run_stays_valid(start_server: Any, tmp_path: Path) -> None:
    """Each request outlives its deadline in the server: every row is DEADLINE_EXCEEDED, `netgain load`
    exits 5 with REQUESTS FAILED (not 3, INVALID), and --max-error-rate 1 does not make it exit 0."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "forward_ms=300", "--max-batch-size", "1",
        "--workers", "0",
    )  # fmt: skip
    for extra in ((), ("--max-error-rate", "1")):
        out = tmp_path / f"run{len(extra)}"
        load = run_netgain(
            "load", "--target", server.target, "--rate", "8", "--timeout-s", "0.05", "--out", str(out),
            *QUICK, "--quiet", *extra, timeout=90,
        )  # fmt: skip
        assert load.returncode == 5, load.stderr + load.stdout
        rows, meta = read_rows(out), read_meta(out)
        n = len(rows["status"])
        assert n == meta["trace"]["requests"] > 0 and set(rows["status"].tolist()) == {"DEADLINE_EXCEEDED"}
        assert meta["counts"]["ok"] == 0 and meta["counts"]["errors"] == n
        assert meta["validity"] == {"valid": True, "reasons": []}
        last = _last_line(load.stdout)
        assert last.startswith("netgain load: REQUESTS FAILED: ") and last.endswith("; none succeeded"), last
        assert f"{n} DEADLINE_EXCEEDED" in last


def test_a_failed_probe_leaves_no_run_so_the_same_out_runs_again(start_server: Any, tmp_path: Path) -> None:
    """Nothing listens on the port: the probe fails (exit 2) and writes no run files, so the same
    --out then takes a real run without --force; a directory holding that run is still refused."""
    out = tmp_path / "run"
    refused = run_netgain(
        "load", "--target", f"{HOST}:{_closed_port()}", "--out", str(out), *QUICK, timeout=60
    )
    assert refused.returncode == 2, refused.stderr + refused.stdout
    assert "refused the connection" in _last_line(refused.stderr)
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert left == [], left
    server = start_server("--model", "null", "--workers", "0")
    again = run_netgain(
        "load", "--target", server.target, "--rate", "10", "--out", str(out), *QUICK, timeout=90
    )
    assert again.returncode == 0, again.stderr + again.stdout
    assert set(read_rows(out)["status"].tolist()) == {"OK"} and read_meta(out)["counts"]["ok"] > 0
    third = run_netgain(
        "load", "--target", server.target, "--rate", "10", "--out", str(out), *QUICK, timeout=60
    )
    assert third.returncode == 2 and "already holds a run" in _last_line(third.stderr), third.stderr


def test_oip_model_the_ready_server_lacks_fails_at_once_a_loading_one_is_waited_for(
    start_server: Any, tmp_path: Path
) -> None:
    """--protocol oip against netgain serve: while the server loads its model the probe waits (one
    line says so) and the run goes ahead; once it is ready, a model name it does not serve fails at
    once with one line naming the model and the server's message, though --wait-ready-s is 60 s
    (the 40 s limit on the command catches a probe that waits it out)."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "load_ms=2500", "--warmup-batches", "0",
        "--workers", "0", wait=False,
    )  # fmt: skip
    server.wait_ports()  # listening, the model still loading
    oip = ("--protocol", "oip", "--model", "null", "--wait-ready-s", "60")
    loading = run_netgain(
        "load", "--target", server.target, *oip, "--oip-model", "slow", "--rate", "10",
        "--out", str(tmp_path / "loading"), *QUICK, timeout=90,
    )  # fmt: skip
    assert loading.returncode == 0, loading.stderr + loading.stdout
    waited = [ln for ln in loading.stderr.splitlines() if "waiting up to 60 s" in ln]
    assert len(waited) == 1 and "model 'slow' (the server is not ready)" in waited[0], loading.stderr
    out = tmp_path / "unknown"
    try:
        unknown = run_netgain(
            "load", "--target", server.target, *oip, "--oip-model", "resnet50", "--out", str(out), *QUICK,
            timeout=40,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the probe waited for a model the ready server does not serve")
    assert unknown.returncode == 2, unknown.stderr + unknown.stdout
    lines = [ln for ln in unknown.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, unknown.stderr
    assert lines[0].startswith(
        f"netgain load: error: target {server.target} has no ready Open Inference Protocol model "
        "'resnet50': the server is ready and does not know it (NOT_FOUND: model 'resnet50' is not served here"
    ), lines[0]
    assert lines[0].endswith("; --oip-model names it"), lines[0]
    assert not out.exists() or not any(out.iterdir())
