"""`netgain report` through the real dispatcher: exit codes, one-line errors, output files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from analysis_fixtures import make_run

from netgain.cli import dispatch
from netgain.cli import report as cli_report


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="netgain")
    parser.add_argument("--debug", action="store_true")
    sub = parser.add_subparsers(dest="command")
    cli_report.add_parser(sub)
    return dispatch(parser, parser.parse_args(argv))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("cli") / "run", rate=200.0, duration_s=4.0, warmup_s=1.0)


def test_text_summary_verdict_first_and_files(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = make_run(run.parent / "base", rate=200.0, duration_s=4.0, warmup_s=1.0, phases_ms={"kernel": 9.0})
    assert (
        _run(
            [
                "report",
                str(run),
                "--baseline",
                str(base),
                "--price-per-hour",
                "1",
                "--baseline-price-per-hour",
                "2",
                "--bootstrap",
                "20",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("VERDICT: NET GAIN")
    for name in ("report.json", "report.md", "report.html"):
        assert (run / name).exists()


def test_json_format_is_the_report(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["report", str(run), "--format", "json", "--bootstrap", "0"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["schema"] == 1 and r == json.loads((run / "report.json").read_text())


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_other_formats(run: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["report", str(run), "--format", fmt, "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert ("# netgain report" in out) if fmt == "markdown" else out.startswith("<!doctype html>")


def test_env_sets_price(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NETGAIN_PRICE_PER_HOUR", "7.2")
    assert _run(["report", str(run), "--format", "json", "--bootstrap", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_per_1k"] == pytest.approx(7.2 / 200 * 1000 / 3600)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_missing_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in _one_line_error(capsys)


def test_bad_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = make_run(tmp_path / "bad", rate=50.0, duration_s=2.0, warmup_s=0.5)
    (bad / "requests.parquet").write_bytes(b"not parquet at all")
    assert _run(["report", str(bad)]) == 2
    assert "not a readable Parquet file" in _one_line_error(capsys)


def test_missing_requests_and_bad_meta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = make_run(tmp_path / "m", rate=50.0, duration_s=2.0, warmup_s=0.5)
    (d / "requests.parquet").unlink()
    assert _run(["report", str(d)]) == 2
    assert "requests.parquet is missing" in _one_line_error(capsys)
    (d / "meta.json").write_text("{oops")
    assert _run(["report", str(d)]) == 2
    assert "not valid JSON" in _one_line_error(capsys)


def test_different_traffic_refused_exit_2(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = make_run(
        run.parent / "other", rate=200.0, duration_s=4.0, warmup_s=1.0, meta={"trace": {"digest": "f"}}
    )
    assert _run(["report", str(other), "--baseline", str(run)]) == 2
    assert "refusing to compare" in _one_line_error(capsys)


def test_bad_numbers(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["report", str(run), "--price-per-hour", "-1"]) == 2
    assert "positive" in _one_line_error(capsys)
    assert _run(["report", str(run), "--span-log", str(run / "missing.jsonl")]) == 2
    assert "span log" in _one_line_error(capsys)
