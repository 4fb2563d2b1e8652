"""Which compared runs compare measures on each side: a warm run per batch size, then one cold run
(a fresh server) at the batch size it chose, the only one the COLD verdict prices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import make_run
from compare_helpers import cpu_vs_cpu

from netgain.contract.rundir import META
from netgain.experiments import cpu_vs_gpu
from netgain.experiments.progress import Progress


def _side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[int, list[str]]], dict[str, Any]]:
    calls: list[tuple[int, list[str]]] = []

    def batch_runs(cfg: Any, side: Any, b: int, runs: dict[str, str], progress: Any) -> None:
        todo = {label: d for label, d in runs.items() if not (Path(d) / META).exists()}  # as it measures
        calls.append((b, list(todo)))
        for run_dir in todo.values():  # batch 4 holds the 100 ms SLO, batch 16 misses it
            extra = ("kernel", 0.5, 300.0) if b == 16 else None
            make_run(Path(run_dir), rate=50.0, duration_s=4.0, warmup_s=1.0, seed=b, inflate=extra)

    monkeypatch.setattr(cpu_vs_gpu, "_batch_runs", batch_runs)
    monkeypatch.setattr(cpu_vs_gpu, "search_side", lambda cfg, side, result, progress, start: result)
    cfg = cpu_vs_cpu(tmp_path, batch_sizes=[4, 16])
    return calls, cpu_vs_gpu.run_side(cfg, cfg.baseline, Progress(8))


def test_only_the_chosen_batch_size_gets_a_cold_run_on_a_fresh_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, result = _side(tmp_path, monkeypatch)
    assert result["best_batch"] == 4
    assert calls == [(4, ["warm"]), (16, ["warm"]), (4, ["cold"])]
    assert list(result["batches"][4]) == ["cold", "warm"] and list(result["batches"][16]) == ["warm"]
    assert not (tmp_path / "baseline" / "b16" / "cold").exists()
    # resumed: every run is reused, none measured again
    calls2, result2 = _side(tmp_path, monkeypatch)
    assert calls2 == [] and result2["batches"] == result["batches"]


def test_a_cold_run_recorded_by_an_earlier_compare_stays_in_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path / "baseline" / "b16" / "cold", rate=50.0, duration_s=4.0, warmup_s=1.0)
    calls, result = _side(tmp_path, monkeypatch)
    assert calls == [(4, ["warm"]), (16, ["warm"]), (4, ["cold"])]
    assert list(result["batches"][16]) == ["cold", "warm"]
