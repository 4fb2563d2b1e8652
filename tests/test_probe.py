"""`netgain load`'s target probe: it says when it waits, and gives up in one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import run_netgain as netgain


@pytest.mark.slow
def test_waiting_for_an_unready_target_is_announced_then_fails_in_one_line(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = netgain(
        "load", "--target", "127.0.0.1:1", "--duration", "1", "--out", str(tmp_path / "x"),
        "--wait-ready-s", "1",
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2, res.stderr
    assert lines[0].startswith("netgain load: waiting up to 1 s for 127.0.0.1:1 to be SERVING (UNAVAILABLE")
    assert "not ready" in lines[1]
    assert 1.0 <= elapsed < 30
    quiet = netgain(
        "load", "--target", "127.0.0.1:1", "--duration", "1", "--out", str(tmp_path / "y"),
        "--wait-ready-s", "0.5", "--quiet",
    )  # fmt: skip
    quiet_lines = [ln for ln in quiet.stderr.splitlines() if ln.strip()]
    assert quiet.returncode == 2 and len(quiet_lines) == 1 and "not ready" in quiet_lines[0]  # --quiet
