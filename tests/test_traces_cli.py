"""``netgain trace ...`` on a fresh argparse parser (independent of the top-level dispatcher)."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from netgain.cli.args import CliError
from netgain.cli.trace import add_parser
from netgain.loadgen.traces import read_trace, synthesize, write_trace


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse and run like the netgain dispatcher: user errors are one line and exit status 2."""
    parser = argparse.ArgumentParser(prog="netgain")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    try:
        args = parser.parse_args(argv)
        try:
            rc = int(args.func(args) or 0)
        except (CliError, ValueError, OSError) as exc:
            print(f"netgain {args.command}: error: {exc}", file=__import__("sys").stderr)
            rc = 2
    except SystemExit as exc:  # argparse usage errors
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_synth_writes_a_seeded_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    argv = [
        "trace",
        "synth",
        "--arrival",
        "gamma",
        "--cv",
        "1.5",
        "--rate",
        "200",
        "--duration",
        "10",
        "--seed",
        "3",
        "--size-bytes",
        "1000",
        "--size-sigma",
        "0.5",
        "--items",
        "1:0.9,8:0.1",
        "--out",
        str(out),
    ]
    rc, stdout, _ = run(argv, capsys)
    assert rc == 0 and f"wrote {out}" in stdout
    expected = synthesize("gamma", 200, 10, 3, cv=1.5, size_bytes=1000, size_sigma=0.5, items="1:0.9,8:0.1")
    assert read_trace(out).digest() == expected.digest()
    assert expected.digest()[:16] in stdout


def test_synth_reads_flags_from_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETGAIN_RATE", "50")
    monkeypatch.setenv("NETGAIN_ARRIVAL", "constant")
    rc, _, _ = run(["trace", "synth", "--duration", "2", "--out", str(tmp_path / "t.parquet")], capsys)
    assert rc == 0 and len(read_trace(tmp_path / "t.parquet")) == 100


def test_synth_user_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "t.csv")
    rc, _, err = run(["trace", "synth", "--duration", "2", "--out", out], capsys)
    assert rc == 2 and "--rate is required" in err
    rc, _, err = run(
        ["trace", "synth", "--arrival", "zipf", "--rate", "5", "--duration", "2", "--out", out], capsys
    )
    assert rc == 2 and "unknown arrival model 'zipf'" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run(
        ["trace", "synth", "--rate", "5", "--duration", "2", "--out", str(tmp_path / "t.txt")], capsys
    )
    assert rc == 2 and "unknown trace format" in err
    rc, _, err = run(["trace"], capsys)
    assert rc == 2 and "synth" in err


def test_inspect_text_json_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(
        synthesize("diurnal", 100, 120, 1, period_s=30, size_bytes=500, size_sigma=1.0, items="1:0.5,4:0.5"),
        path,
    )
    svg = tmp_path / "plots/t.svg"
    rc, out, _ = run(["trace", "inspect", str(path), "--bin-s", "2", "--svg", str(svg)], capsys)
    assert rc == 0
    for needle in (
        "requests over",
        "burstiness",
        "rate over time",
        "inter-arrival times:",
        "payload sizes:",
        "items per request",
        "#",
        "plot:",
    ):
        assert needle in out
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg") and len(root) > 10
    rc, out, _ = run(["trace", "inspect", str(path), "--json"], capsys)
    info = json.loads(out)
    assert rc == 0 and info["requests"] == len(read_trace(path)) and len(info["rate_per_bin"]) == 120


def test_inspect_bad_trace_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("t,size,items\n0,1,1\n1,1,0\n")
    rc, out, err = run(["trace", "inspect", str(bad)], capsys)
    assert rc == 2 and out == ""
    assert (
        err.strip() == f"netgain trace: error: {bad}:3: field 'items': 0 is not valid: need a whole number "
        "of items per request >= 1"
    )
    rc, _, err = run(["trace", "inspect", str(tmp_path / "missing.csv")], capsys)
    assert rc == 2 and "does not exist" in err


def test_fit_text_and_json_then_synth_from_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.parquet"
    write_trace(synthesize("gamma", 200, 60, 2, cv=2.0, size_bytes=800, size_sigma=0.3), path)
    rc, out, _ = run(["trace", "fit", str(path)], capsys)
    assert rc == 0 and "<- best" in out and "gamma" in out
    rc, out, _ = run(["trace", "fit", str(path), "--json"], capsys)
    result = json.loads(out)
    assert rc == 0 and result["best"] == "gamma"
    assert result["gamma"]["params"]["cv"] == pytest.approx(2.0, rel=0.1)
    fit_json = tmp_path / "fit.json"
    fit_json.write_text(out)
    again = tmp_path / "again.csv"
    rc, _, _ = run(
        [
            "trace",
            "synth",
            "--from-fit",
            str(fit_json),
            "--rate",
            "50",
            "--duration",
            "30",
            "--out",
            str(again),
        ],
        capsys,
    )
    tr = read_trace(again)
    assert rc == 0 and tr.mean_rate == pytest.approx(50, rel=0.2) and (tr.size > 0).all()


def test_rescale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "t.csv", tmp_path / "r.parquet"
    write_trace(synthesize("poisson", 100, 30, 4), src)
    rc, _, _ = run(
        ["trace", "rescale", str(src), "--rate", "20", "--duration", "60", "--out", str(dst)], capsys
    )
    tr = read_trace(dst)
    assert rc == 0 and len(tr) == 1200 and tr.duration_s == pytest.approx(60)
    rc, _, err = run(["trace", "rescale", str(src), "--out", str(dst)], capsys)
    assert rc == 2 and "--rate, --duration" in err


def test_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "access.csv"
    log.write_text("ts,bytes\n1714564801000,100\n1714564800000,200\n1714564800500,-\n")
    out = tmp_path / "t.csv"
    rc, stdout, _ = run(
        ["trace", "import", str(log), "--time-column", "ts", "--size-column", "bytes", "--out", str(out)],
        capsys,
    )
    tr = read_trace(out)
    assert rc == 0 and "3 requests" in stdout
    assert tr.t_s.tolist() == [0.0, 0.5, 1.0] and tr.size.tolist() == [200, 0, 100]
    rc, _, err = run(["trace", "import", str(log), "--time-column", "when", "--out", str(out)], capsys)
    assert rc == 2 and "no column 'when'" in err
    rc, _, err = run(["trace", "import", str(log), "--out", str(out)], capsys)
    assert rc == 2  # --time-column is required (argparse)
