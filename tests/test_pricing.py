"""Pricing at measured capacity: the computed crossover of two replica-step cost curves, its interval
from the capacity brackets, and a trace priced on a peak-sized and on a following fleet."""

from __future__ import annotations

import math

import pytest

from netgain.analysis.pricing import crossing, crossing_interval, fleets, replicas


def test_crossover_is_where_the_treatment_wins_for_good() -> None:
    """CPU 100 req/s at 1/h, GPU 400 req/s at 3/h: the GPU is cheaper on (300, 400] (4 CPUs vs one
    GPU), dearer on (800, 900] (9 vs 3 x 3 = 9 is a tie, not cheaper), and cheaper at every rate above 900."""
    c = crossing(100.0, 1.0, 400.0, 3.0)
    assert (c.from_rps, c.first_rps, c.approximate) == (900.0, 300.0, False)
    for r in (901.0, 1000.0, 1250.0, 5000.0, 12_345.0):
        assert replicas(r, 400.0) * 3.0 < replicas(r, 100.0) * 1.0


def test_cheaper_at_every_rate_and_at_none() -> None:
    assert crossing(100.0, 1.0, 1000.0, 0.5).from_rps == 0.0
    never = crossing(100.0, 1.0, 200.0, 3.0)  # 1.5x the cost per unit of capacity
    assert never.from_rps is None and never.first_rps is None


def test_an_unbounded_side_carries_every_rate_on_one_replica() -> None:
    """A GPU that held up to the ceiling at 3/h beats CPUs of 150 req/s at 1/h above 450 req/s."""
    c = crossing(150.0, 1.0, math.inf, 3.0)
    assert c.from_rps == pytest.approx(450.0) and c.first_rps == pytest.approx(450.0)
    assert crossing(math.inf, 1.0, math.inf, 3.0).from_rps is None
    assert crossing(math.inf, 3.0, math.inf, 1.0).from_rps == 0.0


def test_wins_only_between_steps_is_not_a_crossover() -> None:
    """Same cost per unit of capacity (1/100 vs 2/200): the treatment never wins for good; on
    (100, 200] its one replica at 2/h ties two at 1/h, so it is cheaper nowhere."""
    c = crossing(100.0, 1.0, 200.0, 2.0)
    assert c.from_rps is None and c.first_rps is None


def test_interval_from_the_brackets() -> None:
    late, early, (lo, hi) = crossing_interval((90.0, 110.0), 1.0, (380.0, 420.0), 3.0)
    # as late as the brackets allow: CPU at 110, GPU at 380; as early: CPU at 90, GPU at 420
    assert late == crossing(110.0, 1.0, 380.0, 3.0) and early == crossing(90.0, 1.0, 420.0, 3.0)
    assert lo is not None and hi is not None and lo <= crossing(100.0, 1.0, 400.0, 3.0).from_rps <= hi  # type: ignore[operator]
    _, _, (lo2, hi2) = crossing_interval((90.0, 110.0), 1.0, (190.0, 210.0), 3.0)
    assert lo2 is None and hi2 is None


def test_fleets_price_a_trace_by_hand() -> None:
    """Windows of 10 s at 50, 250, 250, 50 req/s; 100 req/s per replica at 3.6/h (0.001 per second);
    cold start 4 s. Peak: 3 replicas x 40 s = 120 instance-seconds for 6,000 requests: 0.12 / 6 = 0.02
    per 1k. Following: 1 + 3 + 3 + 1 replicas x 10 s = 80 s, plus 2 scale-ups x 4 s = 88 s: 0.088 / 6.
    At risk: the second window's 250 - 100 req/s above the one ready replica for 4 s = 600 requests."""
    f = fleets([50, 250, 250, 50], bin_s=10.0, capacity_rps=100.0, price_per_hour=3.6, cold_start_s=4.0)
    assert f["requests"] == 6000.0 and f["peak_rps"] == 250.0 and f["duration_s"] == 40.0
    assert f["peak"]["replicas"] == 3 and f["peak"]["instance_seconds"] == 120.0
    assert f["peak"]["cost"] == pytest.approx(0.12) and f["peak"]["cost_per_1k"] == pytest.approx(0.02)
    a = f["autoscaled"]
    assert (a["max_replicas"], a["scale_ups"], a["instance_seconds"]) == (3, 2, 88.0)
    assert a["cost_per_1k"] == pytest.approx(0.088 / 6) and a["requests_at_risk"] == pytest.approx(600.0)
    with pytest.raises(ValueError):
        fleets([], bin_s=1.0, capacity_rps=1.0, price_per_hour=1.0, cold_start_s=0.0)


def test_the_trace_line_says_when_following_costs_more_than_the_peak_fleet() -> None:
    """Above: following (88 instance-seconds) is cheaper than the peak fleet (120), and the line
    says nothing more. A 2 s spike to 300 req/s in 4 s with a 4 s cold start: the peak fleet is 3
    x 4 = 12 instance-seconds, following 1 + 3 + 1 + 1 = 6 plus 2 scale-ups x 4 = 14, and the line
    says why it costs more."""
    from netgain.cli.experiments import _trace_words

    cheap = fleets([50, 250, 250, 50], bin_s=10.0, capacity_rps=100.0, price_per_hour=3.6, cold_start_s=4.0)
    line = _trace_words("baseline", cheap)
    assert line.startswith(
        "TRACE baseline: peak-sized fleet 3 replicas, 0.02/1k; following the trace up to 3"
    )
    assert "more than the peak-sized fleet" not in line
    spiky = fleets([50, 300, 50, 50], bin_s=1.0, capacity_rps=100.0, price_per_hour=3.6, cold_start_s=4.0)
    assert (spiky["peak"]["instance_seconds"], spiky["autoscaled"]["instance_seconds"]) == (12.0, 14.0)
    assert _trace_words("baseline", spiky).endswith(
        "(2 scale-ups of 4.0 s): more than the peak-sized fleet, as each scale-up bills its cold start"
    )
