"""`netgain demo` run twice into the same directory: each report joins only its own spans, the image
model's smaller size is said, and the demo ends with what it measured and the compare command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_netgain as netgain

pytestmark = pytest.mark.slow


def test_a_second_demo_reports_only_its_own_spans_and_ends_with_the_next_command(tmp_path: Path) -> None:
    """Two demos into one --out: the second report has no span without a client row; the output
    names the size-96 image model, the figures measured, and `netgain compare`."""
    out = tmp_path / "demo"
    args = ("demo", "--rate", "10", "--duration", "2", "--warmup-s", "0.5", "--out", str(out))
    for _ in range(2):
        res = netgain(*args, timeout=300.0)
        assert res.returncode == 0, res.stderr + res.stdout
        join = json.loads((out / "report.json").read_text())["join"]
        assert join["unmatched_spans"] == 0 and join["matched_spans"] > 0, join
    assert "the image model at size 96" in res.stdout
    last = res.stdout.strip().splitlines()
    assert last[-3].startswith("netgain demo: measured image (size 96) on cpu:") and "p99" in last[-3]
    assert last[-1].strip().startswith("netgain compare --model image --rate 10 --slo-p99-ms 500")
