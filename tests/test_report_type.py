"""report.json as a type (``netgain.contract.report``): mypy rejects a misspelt key, and the reader
refuses a report of another schema or without a required key, in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_fixtures import make_run

from netgain.analysis import build_report, write_outputs
from netgain.contract import rundir
from netgain.contract.report import REQUIRED_KEYS, read_report

ROOT = Path(__file__).resolve().parents[1]

USER = """\
from netgain.contract.report import Report, read_report


def p99(run_dir: str) -> float | None:
    r: Report = read_report(run_dir)
    r["{write}"] = False
    return r["{read}"]["p99"]
"""


def _mypy(tmp_path: Path, write: str, read: str) -> subprocess.CompletedProcess[str]:
    mod = tmp_path / "user_of_report.py"
    mod.write_text(USER.format(write=write, read=read))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), str(mod)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_mypy_names_a_misspelt_report_key(tmp_path: Path) -> None:
    """A key renamed on one side (read or written) fails type checking, naming the key."""
    res = _mypy(tmp_path, write="interupted", read="latency_msec")
    assert res.returncode == 1, res.stdout + res.stderr
    assert 'TypedDict "Report" has no key "latency_msec"' in res.stdout
    assert 'TypedDict "Report" has no key "interupted"' in res.stdout


@pytest.mark.slow
def test_mypy_passes_the_right_keys(tmp_path: Path) -> None:
    """The same module with the keys spelt as report.json has them type-checks clean."""
    res = _mypy(tmp_path, write="interrupted", read="latency_ms")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def report_dir(tmp_path: Path) -> Path:
    run = make_run(tmp_path / "run", rate=50.0, duration_s=2.0, warmup_s=0.5)
    write_outputs(build_report(run, bootstrap=0), run)
    return run


def test_read_report_returns_what_was_written(report_dir: Path) -> None:
    """A report this netgain wrote reads back as written, with every required key."""
    doc = json.loads((report_dir / "report.json").read_text())
    assert read_report(report_dir) == doc
    assert set(REQUIRED_KEYS) <= set(doc) and doc["comparison"] is False


def test_read_report_refuses_a_missing_key_in_one_line(report_dir: Path) -> None:
    """A report without a required key is refused, naming the file and the key."""
    path = report_dir / "report.json"
    doc = json.loads(path.read_text())
    del doc["latency_ms"]
    path.write_text(json.dumps(doc))
    with pytest.raises(rundir.RunDirError) as exc:
        read_report(report_dir)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path} lacks the key(s) latency_ms:")


def test_read_report_refuses_another_schema_in_one_line(report_dir: Path) -> None:
    """A report of another schema version is refused before its keys are looked at."""
    path = report_dir / "report.json"
    doc = json.loads(path.read_text())
    doc["schema"] = 2
    del doc["valid"]
    path.write_text(json.dumps(doc))
    with pytest.raises(rundir.SchemaVersionError) as exc:
        read_report(report_dir)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path} is of run-directory schema 2")
