"""A load generator killed by a signal leaves an incomplete run: compare measures that step once
more (the crashed run kept in ``invalid/``) instead of stopping, and a second crash stops it."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import make_run
from compare_helpers import cpu_vs_cpu

from netgain.experiments import cpu_vs_gpu
from netgain.experiments.steps import LoadCrashed, run_step


def test_a_crashed_step_is_measured_once_more_and_the_crashed_run_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "search" / "b8" / "r100"
    calls: list[int] = []
    said: list[str] = []

    def measure() -> None:
        calls.append(1)
        if len(calls) == 1:  # the first attempt wrote part of its run, then died
            run_dir.mkdir(parents=True)
            (run_dir / "requests.parquet.part").write_bytes(b"")
            raise LoadCrashed(f"netgain load crashed (signal 6) for {run_dir}")
        make_run(run_dir, rate=100.0, duration_s=4.0, warmup_s=1.0)

    t, reused = run_step(str(run_dir), 100.0, 100.0, 1e-3, measure, said.append)
    assert len(calls) == 2 and not reused and t.valid and t.held
    assert said == [f"at 100 req/s: netgain load crashed (signal 6) for {run_dir}, repeated once"]
    assert (tmp_path / "search" / "b8" / "invalid" / "r100" / "requests.parquet.part").exists()


def test_a_second_crash_stops_with_its_error(tmp_path: Path) -> None:
    def measure() -> None:
        raise LoadCrashed("netgain load crashed (signal 6)")

    with pytest.raises(LoadCrashed):
        run_step(str(tmp_path / "r50"), 50.0, 100.0, 1e-3, measure, lambda msg: None)


def test_a_load_killed_by_a_signal_is_a_crash_and_a_bad_exit_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cpu_vs_cpu(tmp_path)
    for rc, error in ((-6, LoadCrashed), (2, cpu_vs_gpu.NetgainError)):
        monkeypatch.setattr(cpu_vs_gpu, "run_load", lambda args, quiet, cpus, rc=rc: rc)
        with pytest.raises(error) as caught:
            cpu_vs_gpu._load(cfg, cfg.baseline, "127.0.0.1:1", str(tmp_path / "r"), warmup_s=1.0, extra=[])
        assert isinstance(caught.value, LoadCrashed) == (rc < 0)
