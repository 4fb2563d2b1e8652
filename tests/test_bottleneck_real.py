"""Each bottleneck kind produced on purpose by a real server (tests/bottleneck_handlers.py) and
recognised by `netgain report`; and an overloaded run's throughput counted from its rows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import netgain_cmd, server_env
from conftest import read_rows as rows
from conftest import run_netgain as netgain

pytestmark = pytest.mark.slow


def _load(
    server: Any, out: Path, *args: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    cmd = [*prefix, *netgain_cmd("load", "--target", server.target, "--out", str(out), "--quiet", *args)]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _report(run: Path, *args: str) -> dict[str, Any]:
    res = netgain("report", str(run), "--format", "json", "--bootstrap", "0", *args)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def _kinds(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["kind"]: k for k in r["bottleneck"]["kinds"]}


def test_interpreter_bound_overload(start_server: Any, tmp_path: Path) -> None:
    """Pure-Python pre-processing of 10 ms per item on two pre threads: they share one interpreter,
    so the server carries ~100/s at most. Offered 160/s with a 40-request in-flight cap per worker,
    the backlog fills the cap and requests are dropped: the run is INVALID, the server's bottleneck
    is named (upstream-bound, the interpreter), and the throughput is the completions."""
    srv = start_server(
        "--model", "bottleneck_handlers:BusyPre", "--handler-option", "pre_ms=10",
        "--pre-threads", "2", "--max-batch-size", "4", "--workers", "0",
    )  # fmt: skip
    out = tmp_path / "busy"
    res = _load(
        srv, out, "--rate", "160", "--duration", "5", "--warmup-s", "1", "--max-in-flight", "40",
        "--max-send-lag-ms", "20",
    )  # fmt: skip
    assert res.returncode == 3, res.stderr + res.stdout  # INVALID: dropped at the in-flight cap
    r = _report(out, "--span-log", str(srv.span_log))
    kinds = _kinds(r)
    assert "upstream-bound" in kinds, r["bottleneck"]
    up = kinds["upstream-bound"]
    assert up["resource"] == "interpreter" and "--workers" in up["action"]
    interp = r["cpu"]["interpreter"]
    assert interp["processes"] == 1 and interp["approximate"] is False and interp["per_process"] >= 0.8
    # per thread, neither pre thread alone reaches saturation: only the sum shows it
    assert r["cpu"]["per_thread"]["prepost"] < 0.9
    assert r["valid"] is False and r["counts"]["dropped"] > 0
    if "loadgen-bound" not in kinds:  # the generator kept its schedule: the target caused the drops
        assert r["bottleneck"]["kind"] == "upstream-bound" and r["bottleneck"]["drops_caused_by"] == "target"
    # throughput: OK requests that finished inside the measured window, counted from the rows
    raw = rows(out)
    done = raw["done_ns"].astype(float) / 1e9
    w = r["window_s"]
    completed = (raw["status"] == "OK") & (done >= w["start"]) & (done < w["end"])
    assert r["counts"]["completed_in_window"] == int(completed.sum())
    assert r["throughput_rps"] == pytest.approx(completed.sum() / w["duration"])
    assert r["throughput_rps"] < r["offered_rps"]  # overloaded: it finished less than it was offered
    assert r["cost"]["autoscale"] is None  # no capacity figure from a run that is not evidence


def test_device_bound_on_cpu(start_server: Any, tmp_path: Path) -> None:
    """A sleep-free torch forward pass (GIL released) as the only work, offered above its rate."""
    srv = start_server(
        "--model", "bottleneck_handlers:HeavyForward", "--handler-option", "rounds=60",
        "--max-batch-size", "1", "--intra-op-threads", "1", "--workers", "0",
    )  # fmt: skip
    probe = tmp_path / "probe"
    # Only the service time of this probe is used: a shared host may make the run itself INVALID (3).
    probe_run = _load(
        srv, probe, "--rate", "5", "--duration", "2", "--warmup-s", "0", "--max-send-lag-ms", "50"
    )
    assert probe_run.returncode in (0, 3, 4), probe_run.stderr
    assert len(_service_ms(probe)) >= 5
    service_ms = float(np.median(_service_ms(probe)))
    rate = max(4.0, 2.0 * 1000.0 / service_ms)  # twice what one forward at a time can carry
    out = tmp_path / "heavy"
    _load(srv, out, "--rate", f"{rate:.1f}", "--duration", "5", "--warmup-s", "1", "--max-send-lag-ms", "50")
    r = _report(out)
    kinds = _kinds(r)
    assert "cpu-bound" in kinds, r["bottleneck"]
    assert "more cores" in kinds["cpu-bound"]["action"]
    assert r["gpu"]["kernel_busy_mean"] >= 0.85


def _service_ms(run: Path) -> np.ndarray:
    raw = rows(run)
    ok = raw["status"] == "OK"
    return (raw["done_ns"][ok].astype(float) - raw["sent_ns"][ok].astype(float)) / 1e6


def test_light_load_is_unsaturated(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        "--model", "bottleneck_handlers:BusyPre", "--handler-option", "pre_ms=1", "--workers", "0"
    )
    out = tmp_path / "light"
    res = _load(srv, out, "--rate", "10", "--duration", "4", "--warmup-s", "1", "--max-send-lag-ms", "50")
    assert res.returncode == 0, res.stderr
    r = _report(out)
    assert r["bottleneck"]["kind"] == "unsaturated", r["bottleneck"]
    assert "fixed cost" in r["bottleneck"]["action"] and r["valid"] is True


def test_generator_starved_of_cpu(start_server: Any, tmp_path: Path) -> None:
    """A load generator that cannot get the CPU (stopped 150 ms of every 450 ms, as a starved
    process is): it cannot keep its schedule within --max-send-lag-ms, and the report says the
    generator, not the server. Pausing it is deterministic where CPU contention was not: a nice-19
    generator on one core beside four busy loops still kept its schedule in a 2-core CI run."""
    srv = start_server("--model", "null", "--workers", "0")
    out = tmp_path / "starved"
    cmd = netgain_cmd(
        "load", "--target", srv.target, "--out", str(out), "--quiet", "--rate", "300", "--duration", "3",
        "--warmup-s", "0", "--max-send-lag-ms", "20",
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=server_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    end = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.3)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGSTOP)
                time.sleep(0.15)
                os.killpg(proc.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    res = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert res.returncode == 3, res.stderr + res.stdout
    r = _report(out)
    b = r["bottleneck"]
    assert b["kind"] == "loadgen-bound" and r["valid"] is False, b
    assert "netgain load --workers" in b["action"]
    assert any(e.startswith("send lag p99") for e in _kinds(r)["loadgen-bound"]["evidence"])
