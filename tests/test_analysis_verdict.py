"""The verdict priced at the SLO: net_gain, no_net_gain and inconclusive on run directories built for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from analysis_fixtures import make_run

from netgain.analysis import build_report

COMMON: dict[str, Any] = {"rate": 100.0, "duration_s": 10.0, "warmup_s": 2.0}


def _verdict(t: Path, b: Path, pt: float, pb: float, **kw: Any) -> dict[str, Any]:
    r = build_report(
        t, baseline_dir=b, price_per_hour=pt, baseline_price_per_hour=pb, slo_p99_ms=50.0, bootstrap=200, **kw
    )
    v = r["verdict"]
    assert v["net_gain"] is (v["outcome"] == "net_gain")
    return dict(v)


def test_net_gain(tmp_path: Path) -> None:
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", **COMMON)
    v = _verdict(t, b, 0.9, 1.0)
    assert v["outcome"] == "net_gain", v["reasons"]
    assert v["cost_ratio"] < 1 and v["cost_ratio_ci"][1] < 1
    assert any("treatment" in x and "< baseline" in x for x in v["reasons"])


def test_no_net_gain(tmp_path: Path) -> None:
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", **COMMON)
    v = _verdict(t, b, 3.0, 1.0)
    assert v["outcome"] == "no_net_gain", v["reasons"]
    assert v["cost_ratio"] > 1 and v["cost_ratio_ci"][0] > 1
    assert any(">= baseline" in x for x in v["reasons"])


def test_inconclusive_when_a_side_missed_the_slo(tmp_path: Path) -> None:
    """The baseline's p99 (~200 ms) misses the 50 ms SLO: its capacity at the SLO is unknown, so it
    is not priced at one replica anyway."""
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", phases_ms={"queue": 200.0}, **COMMON)
    v = _verdict(t, b, 3.0, 1.0)
    assert v["outcome"] == "inconclusive" and v["cost_per_1k_baseline"] is None
    assert v["capacity_rps"]["baseline"] is None and v["capacity_rps"]["treatment"] is not None
    unknown = "INCONCLUSIVE: baseline's cost at the SLO is unknown"
    assert any(x.startswith(unknown) and "--sweep" in x for x in v["reasons"])


def test_inconclusive_when_a_run_is_invalid(tmp_path: Path) -> None:
    dropped = {500: "DROPPED"}
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, statuses=dropped, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", **COMMON)
    v = _verdict(t, b, 0.9, 1.0)
    assert v["outcome"] == "inconclusive"
    assert any(x.startswith("INCONCLUSIVE: treatment run is INVALID") for x in v["reasons"])


def test_inconclusive_when_the_cost_ratio_interval_straddles_one(tmp_path: Path) -> None:
    """Errors on a random 30 % of the treatment's requests make its per-second completions vary; the
    prices are set so that the priced cost ratio is 1 (the treatment's capacity of ~70/s needs two
    replicas for 100/s, the baseline's one, at half the price): the interval then straddles it."""
    rng = np.random.default_rng(7)
    errs = {int(i): "UNAVAILABLE" for i in np.flatnonzero(rng.random(1000) < 0.3)}
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, statuses=errs, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", **COMMON)
    v = _verdict(t, b, 0.5, 1.0, sweep_dirs=[t], baseline_sweep_dirs=[b])
    assert v["capacity_rps"]["treatment"] < 100.0 <= v["capacity_rps"]["baseline"]
    lo, hi = v["cost_ratio_ci"]
    assert lo < 1.0 < hi, v
    assert v["outcome"] == "inconclusive"
    assert any("straddles 1" in x for x in v["reasons"])


def _cap(cap: float | None, missed: float, **kw: Any) -> dict[str, Any]:
    return {"capacity_rps": cap, "last_held": cap, "first_missed": missed, "floor_rps": 5.0,
            "precision": 0.1, "runs": 6, "reached_floor": False, "unbounded": False, **kw}  # fmt: skip


def test_a_baseline_that_meets_the_slo_at_no_rate_is_an_answer(tmp_path: Path) -> None:
    """The capacity search proved the baseline misses the SLO down to its floor: YES, the treatment is
    the only way to meet it (not INCONCLUSIVE for want of the baseline's cost)."""
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", phases_ms={"queue": 200.0}, **COMMON)
    caps = {"baseline": _cap(None, 5.0, reached_floor=True), "treatment": _cap(400.0, 440.0)}
    v = _verdict(t, b, 3.0, 1.0, capacity_rps=400.0, capacities=caps)
    assert v["outcome"] == "net_gain" and v["only_side"] == "treatment", v["reasons"]
    assert any(
        "the baseline (cpu) cannot meet p99 <= 50 ms at any rate >= 5 req/s: the treatment (cuda) is the only"
        in x
        for x in v["reasons"]
    )
    caps = {"baseline": _cap(150.0, 160.0), "treatment": _cap(None, 5.0, reached_floor=True)}
    v = _verdict(b, t, 3.0, 1.0, capacity_rps=None, baseline_capacity_rps=150.0, capacities=caps)
    assert v["outcome"] == "no_net_gain" and v["only_side"] == "baseline", v["reasons"]


def test_searched_capacities_give_the_cost_interval_and_what_would_separate_it(tmp_path: Path) -> None:
    """Costs priced at the searched capacities, the interval from the brackets. At 100 req/s one
    replica each, treatment at 2/h vs baseline at 1/h: NO. At 250 req/s, baseline 100 [100, 130) needs
    2 or 3 replicas, treatment 125 [125, 260) at 1.4/h 1 or 2: the ratio is in [1.4/3, 2.8/2], which
    straddles 1: INCONCLUSIVE, saying what precision would separate them."""
    run = {**COMMON, "rate": 250.0}
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **COMMON)
    b = make_run(tmp_path / "b", device="cpu", **COMMON)
    caps = {"baseline": _cap(100.0, 110.0), "treatment": _cap(200.0, 210.0)}
    v = _verdict(t, b, 2.0, 1.0, capacity_rps=200.0, baseline_capacity_rps=100.0, capacities=caps)
    assert v["outcome"] == "no_net_gain" and "from the capacity brackets" in " ".join(v["reasons"])
    t2 = make_run(tmp_path / "t2", device="cuda", phases_ms={"kernel": 1.0}, **run)
    b2 = make_run(tmp_path / "b2", device="cpu", **run)
    caps = {"baseline": _cap(100.0, 130.0), "treatment": _cap(125.0, 260.0)}
    v = _verdict(t2, b2, 1.4, 1.0, capacity_rps=125.0, baseline_capacity_rps=100.0, capacities=caps)
    lo, hi = v["cost_ratio_ci"]
    assert lo < 1 < hi and v["outcome"] == "inconclusive", v["reasons"]
    assert any("capacity brackets overlap" in x and "--precision" in x for x in v["reasons"])
