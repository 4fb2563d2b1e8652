"""benchmarks/bench_peers.py end to end at tiny scale: netgain serve and a real Triton (PyTriton).

Runs the benchmark's capacity search for ``netgain`` and ``triton`` on the null model, bounded by a
low ceiling (at most a few 2-second runs each), then runs it again on the same directory: every
step is found and reused, no server starts, and the bracket is the same. Needs the PyTriton venv
(NETGAIN_TRITON_PYTHON, as tests/test_oip_triton.py); skipped with the reason without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRITON_PYTHON = os.environ.get("NETGAIN_TRITON_PYTHON", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not TRITON_PYTHON or not os.path.exists(TRITON_PYTHON),
        reason="NETGAIN_TRITON_PYTHON (a venv with nvidia-pytriton) is not set: docs/loadgen.md says how",
    ),
]


def _peers(out: str) -> dict[str, dict[str, Any]]:
    with open(os.path.join(out, "peers.json")) as fh:
        doc = json.load(fh)
    assert not doc["skipped"], doc["skipped"]
    return {p["peer"]: p for p in doc["peers"]}


def _bench(out: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, os.path.join(ROOT, "benchmarks", "bench_peers.py"), "--out", out,
        "--peers", "netgain,triton", "--model", "null", "--duration", "2", "--warmup-s", "0.5",
        "--start-rps", "20", "--max-rps", "40", "--min-rps", "5", "--precision", "0.5",
        "--slo-p99-ms", "500", "--triton-python", TRITON_PYTHON, "--triton-instances", "1",
        "--serve-arg=--workers=0",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)


def test_bench_peers_searches_each_peer_and_resumes(tmp_path: pathlib.Path) -> None:
    out = str(tmp_path)
    first = _bench(out)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith("host: ") and "placement" in first.stdout.splitlines()[0]
    assert "placement" in first.stdout.strip().splitlines()[-2]  # printed first and last
    peers = _peers(out)
    assert set(peers) == {"netgain", "triton"}
    assert peers["triton"]["config"]["max_batch_size"] == peers["netgain"]["config"]["max_batch_size"] == 8
    for name, p in peers.items():
        cap = p["capacity"]
        assert 1 <= cap["runs"] == len(p["steps"]) <= 5, (name, cap)
        # a few null requests/s against a 500 ms SLO hold even on a busy host: a bracket, not the floor
        assert cap["capacity_rps"] is not None and cap["last_held"] >= 5, (name, p["steps"])
        for step in p["steps"]:
            assert os.path.exists(os.path.join(step["run_dir"], "requests.parquet"))
            rule = step["valid"] and step["p99"] <= 500 and step["error_ratio"] <= 1e-3
            assert step["held"] == rule, step
    assert "triton" in first.stdout and "null" in first.stdout

    logs = {n: os.path.join(out, n, "server.log") for n in peers}
    sizes = {n: os.path.getsize(path) for n, path in logs.items()}
    second = _bench(out)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(reused)" in second.stderr
    # every step was found: no server started again (each start appends to its log)
    assert {n: os.path.getsize(path) for n, path in logs.items()} == sizes
    again = _peers(out)
    for name in peers:
        assert again[name]["capacity"] == peers[name]["capacity"], name
        assert all("(reused)" in ln for ln in second.stderr.splitlines() if ln.startswith(f"  {name} at "))
