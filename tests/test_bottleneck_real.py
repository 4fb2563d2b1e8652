"""Each bottleneck kind produced on purpose by a real server (tests/bottleneck_handlers.py) and
recognised by `netgain report`; and an overloaded run's throughput counted from its rows."""

from __future__ import annotations

import json
import subprocess
import sys
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
    """The load generator at the lowest priority on one core that busy loops hold: it cannot keep
    its schedule within --max-send-lag-ms, and the report says the generator, not the server."""
    srv = start_server("--model", "null", "--workers", "0")
    # Four busy loops, not one: against a single one a nice-19 generator that sleeps between sends
    # still kept its schedule once on a 2-core CI host.
    hogs = [
        subprocess.Popen(
            [
                "taskset",
                "-c",
                "0",
                sys.executable,
                "-c",
                "import time\nend = time.time() + 60\nwhile time.time() < end: pass",
            ]
        )
        for _ in range(4)
    ]
    try:
        out = tmp_path / "starved"
        res = _load(
            srv, out, "--rate", "300", "--duration", "3", "--warmup-s", "0", "--max-send-lag-ms", "1",
            prefix=("nice", "-n", "19", "taskset", "-c", "0"),
        )  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)
    assert res.returncode == 3, res.stderr + res.stdout
    r = _report(out)
    b = r["bottleneck"]
    assert b["kind"] == "loadgen-bound" and r["valid"] is False, b
    assert "netgain load --workers" in b["action"]
    assert any(e.startswith("send lag p99") for e in _kinds(r)["loadgen-bound"]["evidence"])
