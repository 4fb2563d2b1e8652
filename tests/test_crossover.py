"""The crossover: cost per 1k at the SLO against the request rate on both sides and
the rate where the treatment starts to win; arithmetic on synthetic sweeps, then compare's JSON, text
line and HTML chart on run directories built for it."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import make_run

from netgain.analysis.crossover import cost_per_1k_at, crossover, line, plot, replicas_needed
from netgain.cli.experiments import print_compare
from netgain.experiments.cpu_vs_gpu import CompareConfig, Side, summarize

RATES = [50.0, 100.0, 200.0, 400.0, 800.0]


def _sides(cap_b: float | None, price_b: float, cap_t: float | None, price_t: float) -> dict[str, Any]:
    return {
        "baseline": {"device": "cpu", "capacity_rps": cap_b, "price_per_hour": price_b, "runs": 5},
        "treatment": {"device": "cuda", "capacity_rps": cap_t, "price_per_hour": price_t, "runs": 5},
    }


def test_cost_per_1k_pays_whole_replicas() -> None:
    assert replicas_needed(100.0, 100.0) == 1 and replicas_needed(100.5, 100.0) == 2
    assert replicas_needed(1.0, 100.0) == 1
    # 250 req/s on replicas of 100 req/s: 3 replicas at 2/h = 6/h for 900,000 requests an hour
    assert cost_per_1k_at(250.0, 100.0, 2.0) == pytest.approx(6.0 / 900.0)
    # idle paid: a tenth of a replica's traffic costs ten times as much per request
    assert cost_per_1k_at(10.0, 100.0, 2.0) == pytest.approx(10 * cost_per_1k_at(100.0, 100.0, 2.0))
    assert cost_per_1k_at(10.0, None, 2.0) is None and cost_per_1k_at(10.0, 100.0, None) is None


def test_gpu_wins_above_a_rate() -> None:
    """CPU replicas carry 100 req/s at 1/h, a GPU replica 400 req/s at 3/h: per hour 1, 1, 2, 4, 8
    against 3, 3, 3, 3, 6, so the GPU is cheaper from 400 req/s on."""
    c = crossover(RATES, _sides(100.0, 1.0, 400.0, 3.0), slo_p99_ms=100.0)
    assert c["outcome"] == "crossover" and c["crossover_rps"] == 400.0
    assert c["baseline"]["replicas"] == [1, 1, 2, 4, 8] and c["treatment"]["replicas"] == [1, 1, 1, 1, 2]
    assert c["treatment_cheaper"] == [False, False, False, True, True]
    assert c["wins_at_every_higher_rate"] is True
    assert c["baseline"]["cost_per_1k"][3] == pytest.approx(4.0 / 1440.0)
    assert c["treatment"]["cost_per_1k"][3] == pytest.approx(3.0 / 1440.0)
    assert "from 400 req/s" in c["reason"] and "(200, 400]" in c["reason"] and "x0.750" in c["reason"]
    assert line(c).startswith("CROSSOVER at 400 req/s (treatment cuda vs baseline cpu)")
    svg = plot(c)
    assert svg.count("<polyline") == 2 and "stroke-dasharray" in svg
    assert "crossover at 400 req/s (dashed)" in svg
    _inside_the_viewbox(svg)


def _inside_the_viewbox(svg: str) -> None:
    """Every label's baseline inside the chart, and the text rows below the plot apart from each other."""
    height = float(re.search(r'height="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    ys = sorted({float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)"', svg)})
    assert ys and ys[0] > 0 and ys[-1] <= height - 4
    below = [y for y in ys if y > 228]  # under the plot: ticks, axis label, legend rows
    assert all(b - a >= 13 for a, b in itertools.pairwise(below)), below


def test_replica_steps_can_take_the_win_back() -> None:
    # at 450 req/s: 5 CPU replicas (5/h) against 2 GPU replicas (6/h)
    c = crossover([100.0, 400.0, 450.0], _sides(100.0, 1.0, 400.0, 3.0))
    assert c["crossover_rps"] == 400.0 and c["treatment_cheaper"] == [False, True, False]
    assert c["wins_at_every_higher_rate"] is False and "not again at 450 req/s" in c["reason"]


def test_gpu_cheaper_from_the_lowest_rate() -> None:
    c = crossover(RATES, _sides(100.0, 1.0, 1000.0, 0.5))
    assert c["crossover_rps"] == 50.0 and "already at the lowest rate tried, 50 req/s" in c["reason"]


def test_gpu_never_wins() -> None:
    """A GPU replica carries twice a CPU replica's traffic at three times its price."""
    c = crossover(RATES, _sides(100.0, 1.0, 200.0, 3.0))
    assert c["outcome"] == "not_within_rates" and c["crossover_rps"] is None
    assert not any(c["treatment_cheaper"])
    assert c["reason"].startswith("not within the rates tried (50, 100, 200, 400, 800 req/s)")
    assert "x1.500" in c["reason"]  # 12/h against 8/h at 800 req/s
    assert line(c).startswith("CROSSOVER: not within the rates tried")
    assert "crossover: not within the rates tried" in plot(c)


@pytest.mark.parametrize("unknown", ["baseline", "treatment"])
def test_a_side_with_unknown_capacity_is_inconclusive(unknown: str) -> None:
    sides = _sides(100.0, 1.0, 400.0, 3.0)
    sides[unknown].update(capacity_rps=None, runs_meeting_slo=0)
    c = crossover(RATES, sides, slo_p99_ms=100.0)
    assert c["outcome"] == "inconclusive" and c["crossover_rps"] is None
    assert c[unknown]["cost_per_1k"] == [None] * 5 and c[unknown]["replicas"] == [None] * 5
    other = "treatment" if unknown == "baseline" else "baseline"
    assert None not in c[other]["cost_per_1k"]  # the side that held the SLO is still priced
    assert c["treatment_cheaper"] == [None] * 5
    assert f"the {unknown} ({sides[unknown]['device']}) held the SLO p99 <= 100 ms at none" in c["reason"]
    assert "(0 of 5 sweep runs met it)" in c["reason"]
    assert line(c).startswith("CROSSOVER: INCONCLUSIVE")
    svg = plot(c)
    assert f"{unknown} ({sides[unknown]['device']}): capacity unknown" in svg and svg.count("<polyline") == 1
    _inside_the_viewbox(svg)


# -- compare's output on run directories built for it ---------------------------------------------

SLO = 100.0
RUN: dict[str, Any] = {"duration_s": 6.0, "warmup_s": 1.0}


def _side_runs(root: Path, device: str, held: set[float]) -> dict[str, Any]:
    """A side of compare: warm and cold runs at 100 req/s, a sweep over 50..400 req/s in which the
    rates not in ``held`` miss the SLO (300 ms in the queue)."""
    warm = make_run(root / "b1" / "warm", rate=100.0, device=device, **RUN)
    cold = make_run(root / "b1" / "cold", rate=100.0, device=device, **RUN)
    sweep = [
        make_run(
            root / "sweep" / f"b1-r{r:g}",
            rate=r,
            device=device,
            phases_ms=None if r in held else {"queue": 300.0},
            **RUN,
        )
        for r in (50.0, 100.0, 200.0, 400.0)
    ]
    return {
        "root": str(root),
        "batches": {1: {"cold": str(cold), "warm": str(warm)}},
        "best_batch": 1,
        "sweep": [str(d) for d in sweep],
    }


def _summarize(
    tmp_path: Path, baseline_held: set[float]
) -> tuple[dict[str, Any], list[list[Any]], CompareConfig]:
    cfg = CompareConfig(
        model="image",
        traffic=[],
        duration_s=5.0,
        warmup_s=1.0,
        batch_sizes=[1],
        items=[1],
        rates=[50.0, 100.0, 200.0, 400.0],
        sweep_duration_s=5.0,
        slo_p99_ms=SLO,
        workers=1,
        out=str(tmp_path / "out"),
        baseline=Side("baseline", "cpu", 1.0),
        treatment=Side("treatment", "cuda", 3.0, ["--pre-threads", "4"], tuned="runs/tune-gpu"),
    )
    sides = {
        "baseline": _side_runs(tmp_path / "baseline", "cpu", baseline_held),
        "treatment": _side_runs(tmp_path / "treatment", "cuda", {50.0, 100.0, 200.0, 400.0}),
    }
    reports, rows = summarize(cfg, sides)
    return reports, rows, cfg


def test_compare_output_gpu_wins_above_a_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU held the SLO up to 100 req/s, the GPU up to 400 req/s, at three times the price."""
    reports, rows, cfg = _summarize(tmp_path, {50.0, 100.0})
    for mode in ("warm", "cold"):
        c = json.loads((Path(cfg.out) / f"compare-{mode}" / "report.json").read_text())["crossover"]
        assert c["rates_rps"] == [50.0, 100.0, 200.0, 400.0]
        assert c["baseline"]["capacity_rps"] == pytest.approx(100.0)
        assert c["treatment"]["capacity_rps"] == pytest.approx(400.0)
        assert c["baseline"]["runs_meeting_slo"] == 2 and c["treatment"]["runs_meeting_slo"] == 4
        assert c["baseline"]["capacity_from_run"].endswith("b1-r100")
        assert c["treatment"]["tuned"] == "runs/tune-gpu" and c["treatment"]["serve_args"] == [
            "--pre-threads",
            "4",
        ]
        assert c["baseline"]["cost_per_1k"] == pytest.approx([1 / 180, 1 / 360, 2 / 720, 4 / 1440])
        assert c["treatment"]["cost_per_1k"] == pytest.approx([3 / 180, 3 / 360, 3 / 720, 3 / 1440])
        assert c["crossover_rps"] == 400.0 and c["outcome"] == "crossover"
    html = (Path(cfg.out) / "compare-warm" / "report.html").read_text()
    assert "Cost per 1k at the SLO vs request rate" in html and "crossover at 400 req/s" in html
    assert "<figcaption" in html and "CROSSOVER at 400 req/s" in html
    print_compare(reports, rows, cfg.out)
    out = capsys.readouterr().out
    cross = [x for x in out.splitlines() if x.startswith("CROSSOVER")]
    assert len(cross) == 1 and cross[0].startswith("CROSSOVER at 400 req/s (treatment cuda vs baseline cpu)")
    assert out.index("COLD: net gain") < out.index("CROSSOVER") < out.index("side")


def test_compare_output_baseline_never_held_the_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports, rows, cfg = _summarize(tmp_path, set())
    c = reports["warm"]["crossover"]
    assert c["outcome"] == "inconclusive" and c["crossover_rps"] is None
    assert c["baseline"]["capacity_rps"] is None and c["baseline"]["runs_meeting_slo"] == 0
    assert c["baseline"]["cost_per_1k"] == [None] * 4
    assert "the baseline (cpu) held the SLO p99 <= 100 ms at none of the rates tried (0 of 4" in c["reason"]
    saved = json.loads((Path(cfg.out) / "compare-warm" / "report.json").read_text())["crossover"]
    assert saved["crossover_rps"] is None and saved["baseline"]["cost_per_1k"] == [None] * 4
    html = (Path(cfg.out) / "compare-warm" / "report.html").read_text()
    assert "baseline (cpu): capacity unknown" in html and "crossover: inconclusive" in html
    print_compare(reports, rows, cfg.out)
    assert "CROSSOVER: INCONCLUSIVE (treatment cuda vs baseline cpu)" in capsys.readouterr().out


def test_crossover_computed_from_searched_capacities() -> None:
    """The search's brackets priced as curves: the crossover rate computed on the replica steps
    (900 req/s for CPUs of 100 at 1/h vs GPUs of 400 at 3/h), its interval from the brackets, drawn."""
    from netgain.analysis.crossover import from_capacities

    def cap(c: float | None, missed: float, **kw: Any) -> dict[str, Any]:
        return {"capacity_rps": c, "last_held": c, "first_missed": missed, "floor_rps": 1.0, **kw}

    sides = {
        "baseline": {"device": "cpu", "price_per_hour": 1.0, "capacity": cap(100.0, 110.0)},
        "treatment": {"device": "cuda", "price_per_hour": 3.0, "capacity": cap(400.0, 440.0)},
    }
    c = from_capacities(sides, slo_p99_ms=100.0)
    assert c["outcome"] == "crossover" and c["crossover_rps"] == 900.0 and c["first_cheaper_rps"] == 300.0
    lo, hi = c["crossover_interval_rps"]
    assert lo <= 900.0 <= hi and c["rates_rps"][0] < 100.0 and c["rates_rps"][-1] >= 2 * hi
    i = next(k for k, r in enumerate(c["rates_rps"]) if r > 1000)
    assert c["baseline"]["cost_per_1k"][i] == pytest.approx(
        math.ceil(c["rates_rps"][i] / 100) / (c["rates_rps"][i] * 3.6)
    )
    assert c["treatment_cheaper"][i] is True
    assert line(c).startswith(f"CROSSOVER at 900 req/s [{lo:.4g}, {hi:.4g}] (treatment cuda vs baseline cpu)")
    svg = plot(c)
    assert "crossover interval" in svg and "crossover at 900 req/s" in svg
    _inside_the_viewbox(svg)
    sides["baseline"]["capacity"] = cap(None, 1.0, reached_floor=True)
    c = from_capacities(sides, slo_p99_ms=100.0)
    assert c["outcome"] == "only_treatment" and c["crossover_rps"] is None
    assert "the baseline (cpu) cannot meet p99 <= 100 ms at any rate >= 1 req/s" in c["reason"]
    assert "only the treatment meets the SLO" in plot(c)
