"""compare measures an invalid compared run once more (a cold one on a fresh server): a run the load
generator made invalid is no evidence, and another run removes the reason. Real null servers and
real load runs; only the first runs' send-lag bound is made impossible to meet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compare_helpers import cpu_vs_cpu

from netgain.experiments import cpu_vs_gpu
from netgain.experiments.cpu_vs_gpu import CompareConfig
from netgain.experiments.progress import Progress


def _cfg(tmp_path: Path) -> CompareConfig:
    return cpu_vs_cpu(
        tmp_path,
        traffic=["--rate", "20"],
        duration_s=1.5,
        warmup_s=0.5,
        sweep_duration_s=1.5,
        slo_p99_ms=500.0,
    )


@pytest.mark.slow
def test_an_invalid_cold_and_warm_run_are_each_measured_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_load = cpu_vs_gpu._load
    calls: list[str] = []

    def load(*args: Any, extra: list[str], **kw: Any) -> int:
        out = args[3]
        calls.append(Path(out).name)
        first = calls.count(Path(out).name) == 1
        # A bound no run meets: the first cold and warm runs are INVALID for send lag.
        forced = ["--max-send-lag-ms", "0.000001"] if first else []
        return real_load(*args, extra=[*extra, *forced], **kw)

    monkeypatch.setattr(cpu_vs_gpu, "_load", load)
    cfg = _cfg(tmp_path)
    runs = {label: str(tmp_path / "baseline" / "b1" / label) for label in ("cold", "warm")}
    cpu_vs_gpu._batch_runs(cfg, cfg.baseline, 1, runs, Progress(2))
    err = capsys.readouterr().err

    assert calls == ["cold", "warm", "cold", "warm"]
    for label in ("cold", "warm"):
        note = f"baseline cpu batch 1 {label}: invalid run (the load generator fell behind), repeated once"
        assert note in err
        assert f"baseline cpu batch 1 {label}: p99 " in err
        kept = tmp_path / "baseline" / "b1" / "invalid" / label / "meta.json"
        assert json.loads(kept.read_text())["config"]["max_send_lag_ms"] == pytest.approx(1e-6)
        assert cpu_vs_gpu._summary(runs[label])[1], f"the repeated {label} run is valid"
    # The repeated cold run came right after a fresh server's start: it has its start-up time.
    assert json.loads((Path(runs["cold"]) / "drill.json").read_text())["spawn_to_serving_s"] > 0
    assert err.count("] baseline cpu batch 1 ") == 4  # two notes and two steps, none twice


@pytest.mark.slow
def test_a_crashed_cold_load_is_measured_again_on_a_fresh_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first cold load dies by a signal (as gRPC's core aborting would kill it): the warm run
    goes on on the same server, the cold one is measured on a fresh server, and compare goes on."""
    real_load = cpu_vs_gpu._load
    calls: list[str] = []

    def load(*args: Any, **kw: Any) -> int:
        calls.append(Path(args[3]).name)
        if calls == ["cold"]:
            raise cpu_vs_gpu.LoadCrashed(f"netgain load crashed (signal 6) for {args[3]}")
        return real_load(*args, **kw)

    monkeypatch.setattr(cpu_vs_gpu, "_load", load)
    cfg = _cfg(tmp_path)
    runs = {label: str(tmp_path / "baseline" / "b1" / label) for label in ("cold", "warm")}
    cpu_vs_gpu._batch_runs(cfg, cfg.baseline, 1, runs, Progress(2))
    err = capsys.readouterr().err

    assert calls == ["cold", "warm", "cold"]
    crashed = f"netgain load crashed (signal 6) for {runs['cold']}"
    assert f"baseline cpu batch 1 cold: {crashed}, repeated once" in err
    assert all(cpu_vs_gpu._summary(d)[1] for d in runs.values())
    assert json.loads((Path(runs["cold"]) / "drill.json").read_text())["spawn_to_serving_s"] > 0
