"""The capacity search shared by tune and compare, driven by a fake side (no processes)."""

from __future__ import annotations

import pytest

from netgain.experiments.capacity import Trial, expected_runs, from_trials, search


def side(capacity: float, seen: list[float] | None = None, thr: float = 0.97):
    """A side that holds every rate up to ``capacity`` and completes ``thr`` of what it is offered."""

    def run(rate: float) -> Trial:
        if seen is not None:
            seen.append(rate)
        held = rate <= capacity
        return Trial(rate, rate * thr, 1.0, 50.0 if held else 500.0, 0, 0.0, True, "", held)

    return run


def test_doubles_from_a_start_that_holds_then_bisects_to_the_precision() -> None:
    seen: list[float] = []
    res = search(side(300.0, seen), 50, floor=1, ceiling=10_000, precision=0.1)
    assert seen == [50, 100, 200, 400, 300, 350, 325]
    cap = res.capacity
    assert cap is not None and (cap.last_held, cap.first_missed) == (300, 325)
    assert (cap.first_missed - cap.last_held) / cap.last_held <= 0.1  # type: ignore[operator]
    # 97 % of 300 completed in the window, below the held rate: the point is the held rate.
    assert cap.capacity_rps == 300 and cap.runs == 7 and cap.known
    assert not cap.reached_floor and not cap.unbounded


def test_halves_from_a_start_that_misses_then_bisects() -> None:
    seen: list[float] = []
    cap = search(side(140.0, seen), 800, floor=1, ceiling=10_000, precision=0.1).capacity
    assert seen[:4] == [800, 400, 200, 100] and cap is not None
    assert cap.last_held is not None and cap.first_missed is not None
    assert cap.last_held <= 140 < cap.first_missed
    assert (cap.first_missed - cap.last_held) / cap.last_held <= 0.1


def test_a_side_that_holds_at_no_rate_reaches_the_floor() -> None:
    seen: list[float] = []
    cap = search(side(0.5, seen), 50, floor=5, ceiling=1000, precision=0.1).capacity
    assert seen == [50, 25, 12.5, 6.25, 5] and cap is not None
    assert cap.reached_floor and cap.known and cap.capacity_rps is None and cap.last_held is None
    assert cap.first_missed == 5


def test_a_side_that_holds_everything_is_unbounded_at_the_ceiling() -> None:
    seen: list[float] = []
    cap = search(side(1e9, seen), 100, floor=1, ceiling=1000, precision=0.1).capacity
    assert seen == [100, 200, 400, 800, 1000] and cap is not None
    assert cap.unbounded and not cap.known and cap.first_missed is None and cap.last_held == 1000


def test_precision_sets_the_number_of_bisections() -> None:
    coarse = search(side(300.0), 50, floor=1, ceiling=10_000, precision=0.5).capacity
    fine = search(side(300.0), 50, floor=1, ceiling=10_000, precision=0.01).capacity
    assert coarse is not None and fine is not None and coarse.runs < fine.runs
    for cap, p in ((coarse, 0.5), (fine, 0.01)):
        assert (cap.first_missed - cap.last_held) / cap.last_held <= p  # type: ignore[operator]
    capped = search(side(300.0), 50, floor=1, ceiling=10_000, precision=0.01, max_bisect=1).capacity
    assert capped is not None and capped.runs == 5


def test_start_is_clamped_and_bad_bounds_are_refused() -> None:
    seen: list[float] = []
    search(side(10.0, seen), 0.01, floor=2, ceiling=100, precision=0.5)
    assert seen[0] == 2
    with pytest.raises(ValueError, match="floor"):
        search(side(1.0), 1, floor=10, ceiling=5)
    with pytest.raises(ValueError, match="precision"):
        search(side(1.0), 1, floor=1, ceiling=5, precision=0)


def test_bracket_of_earlier_runs() -> None:
    run = side(150.0)
    cap = from_trials([run(r) for r in (400, 100, 200, 50)], floor=1, ceiling=1e5, precision=0.1)
    assert (cap.last_held, cap.first_missed, cap.runs) == (100, 200, 4)
    none = from_trials([run(r) for r in (400, 200)], floor=200, ceiling=1e5, precision=0.1)
    assert none.reached_floor and none.capacity_rps is None


def test_the_point_stays_in_its_bracket_when_a_short_window_ran_above_its_rate() -> None:
    """Recorded on a GPU host (BERT-base on 12 CPU cores, 3 s steps): the step offered 9.375 req/s
    completed 10.33/s and held, the one offered 10.16 missed; the point is then the held rate."""
    runs = [
        (12.5, 12.67, False),
        (6.25, 7.0, True),
        (9.375, 10.33, True),
        (10.9375, 11.67, False),
        (10.15625, 11.0, False),
    ]
    trials = [Trial(r, thr, 1.0, 50.0 if ok else 110.0, 0, 0.0, True, "", ok) for r, thr, ok in runs]
    cap = from_trials(trials, floor=1, ceiling=1e5, precision=0.1)
    assert (cap.last_held, cap.first_missed, cap.capacity_rps) == (9.375, 10.15625, 9.375)
    it = iter(trials)
    searched = search(lambda rate: next(it), 12.5, floor=1, ceiling=1e5, precision=0.1).capacity
    assert (searched.last_held, searched.first_missed, searched.capacity_rps) == (9.375, 10.15625, 9.375)
    # Inside the bracket the best completed throughput stays the point.
    assert from_trials(trials[:3], floor=1, ceiling=1e5, precision=0.1).capacity_rps == 10.33


def test_the_point_is_the_held_rate_when_a_bursty_window_completed_less() -> None:
    """A bursty trace scaled to 5.08 req/s sent most of its 20 requests before the measured window:
    1 completed/s in it, and it held; the point is the rate offered, not the window's count."""
    runs = [(10.16, 4.0, False), (5.08, 1.0, True), (5.47, 1.5, False), (2.54, 2.0, True)]
    trials = [Trial(r, thr, 1.0, 50.0 if ok else 300.0, 0, 0.0, True, "", ok) for r, thr, ok in runs]
    cap = from_trials(trials, floor=1, ceiling=1e5, precision=0.1)
    assert (cap.last_held, cap.first_missed, cap.capacity_rps) == (5.08, 5.47, 5.08)


def test_expected_runs_bound_the_real_count() -> None:
    typical, most = expected_runs(50, 1, 10_000, 0.1)
    assert typical <= most
    res = search(side(300.0), 50, floor=1, ceiling=10_000, precision=0.1)
    assert res.capacity is not None and res.capacity.runs <= most
