"""Smoke test of benchmarks/bench_protocols.py: it runs both protocols against the null model and
prints both rows and the difference line (no figure is asserted: it is a benchmark, not a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_protocols_runs_both_protocols_side_by_side() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "benchmarks/bench_protocols.py", "--model", "null", "--rates", "50"]
    out = subprocess.run(
        [*cmd, "--duration", "1", "--warmup-s", "0.5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=True,
    ).stdout  # fmt: skip
    assert "placement" in out or "pinned" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("50 ")]
    assert sorted(r[1].strip() for r in rows) == ["netgain", "oip"], out
    assert all(r[3].strip() == "0" for r in rows), out  # no errors
    assert "50/s: OIP - netgain.v1: outside p50" in out
