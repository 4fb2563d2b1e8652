"""Baseline vs treatment: refusals, ratios and the verdict on runs with known outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import make_run

from loadgen.analysis import AnalysisError, build_report
from server.cliargs import CliError

GPU_FAST = {"kernel": 0.5, "h2d": 0.2, "d2h": 0.1, "pre": 2.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cmp")
    return {
        "cpu": make_run(root / "cpu", rate=400.0, duration_s=8.0, warmup_s=1.0, phases_ms={"kernel": 20.0}),
        "gpu": make_run(
            root / "gpu", rate=400.0, duration_s=8.0, warmup_s=1.0, device="cuda", phases_ms=GPU_FAST
        ),
        "gpu_slow": make_run(
            root / "gpu_slow",
            rate=400.0,
            duration_s=8.0,
            warmup_s=1.0,
            device="cuda",
            phases_ms={"queue": 60.0},
        ),
        "other": make_run(
            root / "other",
            rate=400.0,
            duration_s=8.0,
            warmup_s=1.0,
            device="cuda",
            meta={"trace": {"digest": "e" * 64}},
        ),
    }


def test_different_trace_is_refused(runs: dict[str, Path]) -> None:
    with pytest.raises(AnalysisError, match="trace digest differs") as exc:
        build_report(runs["other"], baseline_dir=runs["cpu"], bootstrap=0)
    assert isinstance(exc.value, CliError) and "--force" in str(exc.value) and "\n" not in str(exc.value)


def test_force_compares_and_says_so(runs: dict[str, Path]) -> None:
    r = build_report(
        runs["other"],
        baseline_dir=runs["cpu"],
        bootstrap=0,
        force=True,
        price_per_hour=1.0,
        baseline_price_per_hour=1.0,
    )
    assert any("FORCED" in x for x in r["verdict"]["reasons"])
    assert r["traffic_differences"] and r["comparison"] is True


def test_cheaper_per_hour_and_faster_gpu_is_net_gain(runs: dict[str, Path]) -> None:
    r = build_report(
        runs["gpu"],
        baseline_dir=runs["cpu"],
        price_per_hour=0.9,
        baseline_price_per_hour=1.0,
        slo_p99_ms=50.0,
        bootstrap=100,
    )
    v = r["verdict"]
    assert v["net_gain"] is True, v["reasons"]
    # same throughput (400/s over 7 s both sides) so the cost ratio is the price ratio exactly
    assert r["ratios"]["throughput"]["value"] == pytest.approx(1.0)
    assert r["ratios"]["cost_per_1k"]["value"] == pytest.approx(0.9)
    assert r["ratios"]["cost_per_1k"]["ci"] == pytest.approx([0.9, 0.9])
    assert r["ratios"]["p99"]["value"] == pytest.approx(
        r["treatment"]["latency_ms"]["p99"] / r["baseline"]["latency_ms"]["p99"]
    )
    lo, hi = r["ratios"]["p99"]["ci"]
    assert lo <= r["ratios"]["p99"]["value"] * 1.05 and hi >= r["ratios"]["p99"]["value"] * 0.95
    assert v["cost_per_1k_treatment"] == pytest.approx(0.9 / 400 * 1000 / 3600)
    assert r["maintainability"] and "CUDA 12.4" in r["maintainability"][0]
    assert r["baseline"]["device"] == "cpu" and r["treatment"]["device"] == "cuda"
    assert r["latency_ms"] == r["treatment"]["latency_ms"]


def test_gpu_more_expensive_is_no_gain(runs: dict[str, Path]) -> None:
    r = build_report(
        runs["gpu"], baseline_dir=runs["cpu"], price_per_hour=3.0, baseline_price_per_hour=1.0, bootstrap=0
    )
    assert r["verdict"]["net_gain"] is False
    assert r["ratios"]["cost_per_1k"]["value"] == pytest.approx(3.0)
    assert any(">= baseline" in x for x in r["verdict"]["reasons"])


def test_cheaper_but_worse_tail_is_no_gain(runs: dict[str, Path]) -> None:
    r = build_report(
        runs["gpu_slow"],
        baseline_dir=runs["cpu"],
        price_per_hour=0.5,
        baseline_price_per_hour=1.0,
        slo_p99_ms=40.0,
        bootstrap=50,
    )
    assert r["verdict"]["net_gain"] is False
    assert any("> allowed" in x for x in r["verdict"]["reasons"])


def test_missing_price_is_no_verdict(runs: dict[str, Path]) -> None:
    r = build_report(runs["gpu"], baseline_dir=runs["cpu"], bootstrap=0)
    assert r["verdict"]["net_gain"] is False and any("unknown" in x for x in r["verdict"]["reasons"])


def test_invalid_side_is_no_gain(tmp_path: Path, runs: dict[str, Path]) -> None:
    bad = make_run(
        tmp_path / "bad",
        rate=400.0,
        duration_s=8.0,
        warmup_s=1.0,
        device="cuda",
        phases_ms=GPU_FAST,
        statuses={900: "DROPPED"},
    )
    r = build_report(
        bad, baseline_dir=runs["cpu"], price_per_hour=0.5, baseline_price_per_hour=1.0, bootstrap=0
    )
    assert r["verdict"]["net_gain"] is False and any("INVALID" in x for x in r["verdict"]["reasons"])


def test_sweep_gives_capacity(tmp_path: Path) -> None:
    sweep = [
        make_run(
            tmp_path / f"r{rate}",
            rate=float(rate),
            duration_s=4.0,
            warmup_s=1.0,
            device="cuda",
            phases_ms={"queue": q},
        )
        for rate, q in ((100, 1.0), (200, 5.0), (400, 80.0))
    ]
    r = build_report(sweep[0], sweep_dirs=sweep, slo_p99_ms=50.0, price_per_hour=3.6, bootstrap=0)
    assert r["sweep"]["capacity_rps"] == pytest.approx(200.0) and r["sweep"]["runs_meeting_slo"] == 2
    auto = r["cost"]["autoscale"]
    # 100/s offered on replicas of 200/s capacity: one replica, half busy
    assert auto["capacity_rps"] == pytest.approx(200.0) and auto["max_replicas"] == 1
    assert auto["cost_per_1k"] == pytest.approx(3.6 / 100 * 1000 / 3600)
