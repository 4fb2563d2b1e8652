"""Baseline vs treatment: refusals, ratios and the verdict on runs with known outcomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_fixtures import make_run

from netgain.analysis import AnalysisError, build_report, capacity_at_slo, cost
from netgain.analysis import comparison as cmp
from netgain.analysis.comparison import traffic_differences
from netgain.analysis.run_summary import RunResult
from netgain.errors import NetgainError

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
    assert isinstance(exc.value, NetgainError) and "--force" in str(exc.value) and "\n" not in str(exc.value)


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
    # the same 400/s over 7 s on both sides: completions in the window differ by the requests
    # still in flight at its edges, so the cost ratio is the price ratio within that
    assert r["ratios"]["throughput"]["value"] == pytest.approx(1.0, abs=2 / 2800)
    assert r["ratios"]["cost_per_1k"]["value"] == pytest.approx(0.9, rel=2 / 2800)
    assert r["ratios"]["cost_per_1k"]["ci"] == pytest.approx([0.9, 0.9], rel=0.005)
    assert v["outcome"] == "net_gain"
    assert r["ratios"]["p99"]["value"] == pytest.approx(
        r["treatment"]["latency_ms"]["p99"] / r["baseline"]["latency_ms"]["p99"]
    )
    lo, hi = r["ratios"]["p99"]["ci"]
    assert lo <= r["ratios"]["p99"]["value"] * 1.05 and hi >= r["ratios"]["p99"]["value"] * 0.95
    assert v["cost_per_1k_treatment"] == pytest.approx(0.9 / 400 * 1000 / 3600, rel=2 / 2800)
    assert r["maintainability"] and "CUDA 12.4" in r["maintainability"][0]
    assert r["baseline"]["device"] == "cpu" and r["treatment"]["device"] == "cuda"
    assert r["latency_ms"] == r["treatment"]["latency_ms"]


def test_gpu_more_expensive_is_no_gain(runs: dict[str, Path]) -> None:
    r = build_report(
        runs["gpu"], baseline_dir=runs["cpu"], price_per_hour=3.0, baseline_price_per_hour=1.0, bootstrap=0
    )
    assert r["verdict"]["net_gain"] is False
    assert r["ratios"]["cost_per_1k"]["value"] == pytest.approx(3.0, rel=2 / 2800)
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


def test_a_baseline_over_the_slo_at_the_compared_rate_is_named_as_the_bar(runs: dict[str, Path]) -> None:
    kw: dict[str, Any] = {"baseline_dir": runs["cpu"], "price_per_hour": 0.5, "baseline_price_per_hour": 1.0}
    over = build_report(runs["gpu"], slo_p99_ms=1.0, bootstrap=0, **kw)["verdict"]["reasons"]
    (line,) = [x for x in over if x.startswith("treatment p99 ")]
    assert line.endswith(
        "(max of SLO 1.0 and baseline p99 upper CI; "
        "the baseline misses the SLO at this rate, so the bar is its tail)"
    )
    within = build_report(runs["gpu"], slo_p99_ms=1000.0, bootstrap=0, **kw)["verdict"]["reasons"]
    assert any(
        x.endswith("<= allowed 1000.000 ms (max of SLO 1000.0 and baseline p99 upper CI)") for x in within
    )


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


def test_same_digest_with_differently_formatted_source_is_compared(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # a sweep run written "rate=400" against a baseline written "rate=400.0": same schedule (digest)
    sweep_run = make_run(
        tmp_path / "sweep",
        rate=400.0,
        duration_s=8.0,
        warmup_s=1.0,
        device="cuda",
        phases_ms=GPU_FAST,
        meta={
            "trace": {"source": "synthetic:poisson rate=400 duration_s=8 seed=0", "mean_rate": 400},
            "config": {
                "arrival": "synthetic:poisson rate=400 duration_s=8 seed=0",
                "rate": 400.00000000000006,
            },
        },
    )
    r = build_report(
        sweep_run, baseline_dir=runs["cpu"], price_per_hour=0.9, baseline_price_per_hour=1.0, bootstrap=0
    )
    assert r["traffic_differences"] == [] and r["comparison"] is True


def test_traffic_fields_compared_with_numbers_normalised() -> None:
    def meta(digest: str | None, source: str, **config: object) -> dict:
        return {
            "trace": {"digest": digest, "source": source, "requests": 800, "mean_rate": 400.0},
            "config": {"arrival": source, "rate": 400.0, "mode": "open", "concurrency": 0, **config},
            "server": {"model": "image"},
        }

    d = "d" * 64
    assert traffic_differences(meta(d, "a rate=400.0"), meta(d, "file:/elsewhere/trace.parquet")) == []
    # still refused: a different rate, mode or concurrency, even with the same digest
    assert traffic_differences(meta(d, "x"), meta(d, "x", rate=200)) == ["config.rate differs (400.0 vs 200)"]
    assert traffic_differences(meta(d, "x"), meta(d, "x", mode="closed", concurrency=8)) == [
        "config.mode differs ('open' vs 'closed')",
        "config.concurrency differs (0 vs 8)",
    ]
    # without a digest the descriptions are all there is: compared, numbers normalised
    missing = "a trace digest is missing from meta.json, so identical traffic cannot be verified"
    assert traffic_differences(
        meta(None, "synthetic:poisson rate=400.0 seed=0"), meta(None, "synthetic:poisson rate=400 seed=0")
    ) == [missing]
    assert traffic_differences(
        meta(None, "synthetic:poisson rate=400"), meta(None, "synthetic:poisson rate=200")
    ) == [
        missing,
        "config.arrival differs ('synthetic:poisson rate=400' vs 'synthetic:poisson rate=200')",
        "trace.source differs ('synthetic:poisson rate=400' vs 'synthetic:poisson rate=200')",
    ]
    # a number inside a word or path is not reformatted
    assert traffic_differences(
        meta(None, "file:/runs/run01/t.parquet"), meta(None, "file:/runs/run1/t.parquet")
    ) != [missing]


def test_sweep_capacity_respects_max_error_rate_from_meta(tmp_path: Path) -> None:
    # 200/s meets the p99 SLO but fails 10 of its 600 measured requests (1.67 %) while
    # config.max_error_rate is 1 %: the same SLO a single run is judged by excludes it
    cfg = {"config": {"max_error_rate": 0.01}}
    r100 = make_run(tmp_path / "r100", rate=100.0, duration_s=4.0, warmup_s=1.0, meta=cfg)
    r200 = make_run(
        tmp_path / "r200",
        rate=200.0,
        duration_s=4.0,
        warmup_s=1.0,
        meta=cfg,
        statuses={i: "UNAVAILABLE" for i in range(300, 310)},
    )
    cap = capacity_at_slo([r100, r200], slo_p99_ms=50.0)
    assert cap["capacity_rps"] == pytest.approx(100.0) and cap["from_run"] == str(r100)
    assert cap["runs_meeting_slo"] == 1 and cap["points"][1]["error_rate"] == pytest.approx(10 / 600)
    assert capacity_at_slo([r100, r200], slo_p99_ms=50.0, max_error_rate=0.05)[
        "capacity_rps"
    ] == pytest.approx(590 / 3)


def test_autoscaled_cost_ratio_interval_from_capacity_draws() -> None:
    # 100 arrivals/s for 10 s at $3.6/h. Capacity draws of 100/s need one replica: 10 instance-s,
    # $0.01 for 1,000 requests -> $0.01 per 1k. Draws of 99/s need two (the second billed while
    # it starts): 20 instance-s -> $0.02 per 1k. The baseline's capacity was given: $0.005 fixed.
    rate = np.full(10, 100.0)
    auto = cost.autoscale(rate, capacity_rps=100.0, cold_start_s=2.0, price_per_hour=3.6)
    auto["capacity_source"] = "this run's successful throughput (a lower bound on capacity)"
    treat = RunResult(
        report={"cost": {"price_per_hour": 3.6, "autoscale": auto}},
        thr_draws=np.array([100.0] * 10 + [99.0] * 10),
    )
    base = RunResult(
        report={
            "cost": {"price_per_hour": 1.0, "autoscale": {"cost_per_1k": 0.005, "capacity_source": "given"}}
        },
        thr_draws=np.array([150.0] * 20),
    )
    assert auto["cost_per_1k"] == pytest.approx(0.01)
    assert cmp._autoscaled_draws(treat) == pytest.approx([0.01] * 10 + [0.02] * 10)
    assert cmp._autoscaled_draws(base) is None  # a given capacity has no draws here
    assert cmp._autoscaled_ratio_ci(base, treat) == pytest.approx([2.0, 4.0])
    assert cmp._autoscaled_ratio_ci(base, base) is None
