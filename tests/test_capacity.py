"""The capacity search shared by tune and compare, driven by a fake side (no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from netgain.experiments.capacity import (
    P99_SAMPLES,
    STEP_REQUESTS,
    Capacity,
    Trial,
    expected_runs,
    from_trials,
    search,
    start_from,
    step_seconds,
    thin,
)


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


def test_a_low_rate_step_runs_long_enough_to_bound_its_p99_up_to_twice_the_step() -> None:
    assert P99_SAMPLES == 299  # the report's enough_samples: the fewest that bound p99 at 95 %
    assert STEP_REQUESTS == 299 + 3 * 18  # three standard deviations of Poisson(299) above it
    assert step_seconds(15.0, 100.0) == 15.0  # 1,500 requests: the step as set
    assert step_seconds(15.0, 20.0) == pytest.approx(353 / 20.0)  # 17.65 s sends 353 on average
    assert step_seconds(3.0, 10.0) == 6.0  # 35 s would: at most twice the step
    assert step_seconds(3.0, 0.0) == step_seconds(3.0, float("nan")) == 3.0
    assert step_seconds(0.0, 10.0) == 0.0


def test_a_compare_step_at_a_low_rate_asks_the_load_generator_for_the_longer_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compare_helpers import cpu_vs_cpu

    from netgain.experiments import cpu_vs_gpu

    asked: dict[float, float] = {}

    def load(cfg: Any, side: Any, target: str, run_dir: str, **kw: Any) -> None:
        rate = float(kw["traffic"][kw["traffic"].index("--rate") + 1])
        asked[rate] = kw["duration_s"]

    monkeypatch.setattr(cpu_vs_gpu, "_load", load)
    cfg = cpu_vs_cpu(tmp_path, sweep_duration_s=5.0)
    for rate in (400.0, 40.0, 20.0):
        cpu_vs_gpu._sweep_load(cfg, cfg.baseline, "127.0.0.1:1", str(tmp_path / f"r{rate:g}"), rate)
    assert asked == {400.0: 5.0, 40.0: pytest.approx(353 / 40.0), 20.0: 10.0}


def test_a_step_judged_on_too_few_requests_says_so_in_its_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from compare_helpers import cpu_vs_cpu

    from netgain.experiments import cpu_vs_gpu
    from netgain.experiments.progress import Progress

    def step(
        run_dir: str, rate: float, slo: float, bound: float, measure: Any, say: Any
    ) -> tuple[Trial, bool]:
        held = rate <= 40
        # 9 requests measured at 20 req/s (a bursty trace's window), plenty from 40 req/s up
        n = 9 if rate < 40 else int(rate * 10)
        return Trial(rate, rate, 5.0, 50.0 if held else 500.0, 0, 0.0, True, "", held, samples=n), False

    monkeypatch.setattr(cpu_vs_gpu, "run_step", step)
    cfg = cpu_vs_cpu(tmp_path, min_rps=10.0, max_rps=80.0, precision=0.5)
    cpu_vs_gpu.search_side(
        cfg,
        cfg.baseline,
        {"root": str(tmp_path), "best_batch": 1, "batches": {1: {"warm": ""}}},
        Progress(8),
        start=20.0,
    )
    lines = capsys.readouterr().err.splitlines()
    assert any(
        "at 20 req/s: 20 done/s, p99 50.00 ms, held on 9 successful requests (a p99 needs 299)" in s
        for s in lines
    )
    assert any("at 40 req/s: 40 done/s, p99 50.00 ms, held" in s and s.endswith("held") for s in lines)


def test_a_search_starts_at_half_the_rate_its_nearest_resource_allows() -> None:
    assert start_from(50.0, 0.05) == 500.0  # 50 req/s at 5 % of saturation: it would reach it at 1,000
    assert start_from(50.0, 0.9) is None and start_from(50.0, 0.5) is None  # no room above 50 to read
    assert start_from(50.0, 0.001) == 1600.0  # at most 32 times the rate it extrapolates from
    assert start_from(50.0, None) is None and start_from(50.0, 0.0) is None and start_from(0.0, 0.5) is None


def test_first_rate_reads_a_warm_run_that_held_and_not_one_that_missed(tmp_path: Path) -> None:
    from analysis_fixtures import make_run

    from netgain.experiments.steps import first_rate

    gpu = {"netgain_gpu_utilization_ratio": 0.085, "netgain_kernel_busy_ratio": 0.05}
    held = make_run(tmp_path / "held", rate=100.0, duration_s=4.0, warmup_s=1.0, device="cuda", samples=gpu)
    got = first_rate(str(held), 100.0, 1e-3)
    assert got is not None
    rate, why = got
    # the device busy 0.085 is 0.1 of its 0.85 threshold: 1,000 req/s there, the search starts at half
    assert rate == pytest.approx(500.0, rel=0.05)
    assert "the warm run held" in why and "gpu at 0.10 of saturation" in why
    missed = make_run(tmp_path / "missed", rate=100.0, duration_s=4.0, warmup_s=1.0, samples=gpu)
    assert first_rate(str(missed), 1.0, 1e-3) is None  # p99 over a 1 ms SLO: no room to read
    assert first_rate(str(tmp_path / "none"), 100.0, 1e-3) is None


def test_compare_starts_its_search_where_the_warm_run_leaves_room_and_a_resumed_one_where_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from compare_helpers import cpu_vs_cpu

    from netgain.experiments import cpu_vs_gpu, steps
    from netgain.experiments.progress import Progress

    seen: list[float] = []

    def step(
        run_dir: str, rate: float, slo: float, bound: float, measure: Any, say: Any
    ) -> tuple[Trial, bool]:
        return side(600.0, seen)(rate), False

    def first(root: Path, start: float | None = None, **cfg: Any) -> float:
        seen.clear()
        c = cpu_vs_cpu(root, precision=0.5, **cfg)
        result = {"root": str(root), "best_batch": 1, "batches": {1: {"warm": str(root / "w")}}}
        cpu_vs_gpu.search_side(c, c.baseline, result, Progress(8), start=start)
        return seen[0]

    monkeypatch.setattr(cpu_vs_gpu, "run_step", step)
    monkeypatch.setattr(steps, "first_rate", lambda run_dir, slo, bound: (400.0, "room"))
    assert first(tmp_path / "a", 100.0) == 400.0
    assert "baseline cpu search batch 1 starts at 400 req/s: room" in capsys.readouterr().err
    monkeypatch.setattr(steps, "first_rate", lambda run_dir, slo, bound: (900.0, "more room"))
    assert first(tmp_path / "a", 100.0) == 400.0  # resumed: where it began, so its steps are reused
    assert first(tmp_path / "b", 1000.0) == 1000.0  # a higher start given (the baseline's capacity) stands
    assert first(tmp_path / "c", 100.0, max_rps=600.0) == 600.0  # never above the ceiling
    assert "starts at 600 req/s: more room" in capsys.readouterr().err
    (tmp_path / "d" / "search" / "b1" / "r100").mkdir(parents=True)
    assert first(tmp_path / "d", 100.0) == 100.0  # a search begun before starts were recorded
    assert first(tmp_path / "e", start_rps=50.0, start_from_warm=False) == 50.0  # --start-rps, --trace
    assert first(tmp_path / "e", 100.0) == 50.0  # resumed without --start-rps: where it began


def test_compare_reads_the_warm_run_only_without_start_rps_or_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from netgain.cli import main
    from netgain.experiments import cpu_vs_gpu

    calls: list[tuple[bool, float, float | None]] = []

    def run_side(cfg: Any, side: Any, progress: Any, start: float | None = None) -> dict[str, Any]:
        calls.append((cfg.start_from_warm, cfg.start_rps, start))
        if side.name == "treatment":
            raise SystemExit(0)
        return {"capacity": {"last_held": 25.0}}

    monkeypatch.setattr(cpu_vs_gpu, "run_side", run_side)
    trace = tmp_path / "t.csv"
    trace.write_text("t,size\n" + "".join(f"{i / 40:.3f},100\n" for i in range(81)))
    base = ["compare", "--model", "null", "--treatment-device", "cpu", "--cpu-price-per-hour", "1",
            "--gpu-price-per-hour", "2", "--slo-p99-ms", "100", "--out", str(tmp_path / "o")]  # fmt: skip
    for extra, want in (
        ([], [(True, 50.0, None), (True, 50.0, 25.0)]),  # the treatment from the baseline's capacity
        (["--start-rps", "10"], [(False, 10.0, None), (False, 10.0, None)]),
        (
            ["--trace", str(trace)],
            [(False, pytest.approx(40.0, rel=0.02), None), (False, pytest.approx(40.0, rel=0.02), 25.0)],
        ),
    ):
        calls.clear()
        with pytest.raises(SystemExit):
            main([*base, *extra])
        assert calls == want, extra


def test_the_search_takes_the_compared_warm_run_as_its_step_at_that_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis_fixtures import make_run
    from compare_helpers import cpu_vs_cpu

    from netgain.experiments import cpu_vs_gpu
    from netgain.experiments.progress import Progress

    warm = make_run(tmp_path / "warm", rate=50.0, duration_s=4.0, warmup_s=1.0)
    measured: list[float] = []

    def step(
        run_dir: str, rate: float, slo: float, bound: float, measure: Any, say: Any
    ) -> tuple[Trial, bool]:
        measured.append(rate)
        return side(20.0)(rate), False

    def search(root: Path, **cfg: Any) -> dict[str, Any]:
        measured.clear()
        c = cpu_vs_cpu(root, slo_p99_ms=0.5, start_from_warm=False, min_rps=5.0, precision=0.5, **cfg)
        result = {"root": str(root), "best_batch": 1, "batches": {1: {"warm": str(warm)}}}
        return cpu_vs_gpu.search_side(c, c.baseline, result, Progress(8))

    monkeypatch.setattr(cpu_vs_gpu, "run_step", step)
    # the warm run at 50 req/s missed a 0.5 ms p99: the search goes on from 25 without measuring 50
    out = search(tmp_path / "a")
    assert measured == [25.0, 12.5, 18.75] and out["sweep"][0] == str(warm)
    assert out["capacity"]["first_missed"] == 25.0 and out["capacity"]["runs"] == 4
    (line,) = [s for s in capsys.readouterr().err.splitlines() if "at 50 req/s: " in s]
    assert ", missed" in line and line.endswith("(the compared warm run)")
    # a trace's steps replay it rescaled, so its warm run is no step; nor with no --rate given
    assert search(tmp_path / "b", traffic=["--trace", "t.csv"]) and measured[0] == 50.0
    assert search(tmp_path / "c", traffic=[]) and measured[0] == 50.0
    # a step measured at that rate before (a search begun earlier) is the one it reads again
    make_run(tmp_path / "d" / "search" / "b1" / "r50", rate=50.0, duration_s=4.0, warmup_s=1.0)
    assert search(tmp_path / "d") and measured[0] == 50.0


def test_runs_recorded_elsewhere_count_their_warm_run_as_the_step_at_its_rate(tmp_path: Path) -> None:
    from analysis_fixtures import make_run
    from compare_helpers import cpu_vs_cpu

    from netgain.cli.experiments import _capacity_words
    from netgain.contract.rundir import META
    from netgain.experiments import cpu_vs_gpu
    from netgain.experiments.progress import Progress

    root = tmp_path / "recorded"
    warm = make_run(
        root / "b1" / "warm", rate=50.0, duration_s=4.0, warmup_s=1.0, inflate=("kernel", 0.5, 300.0)
    )
    for rate in (25.0, 37.5):
        make_run(root / "search" / "b1" / f"r{rate:g}", rate=rate, duration_s=4.0, warmup_s=1.0)
    c = cpu_vs_cpu(tmp_path / "o", baseline=cpu_vs_gpu.Side("baseline", "cpu", 1.0, from_dir=str(root)))
    result = {"root": str(root), "best_batch": 1, "batches": {1: {"warm": str(warm)}}}
    cap = cpu_vs_gpu.search_side(c, c.baseline, result, Progress(8))["capacity"]
    assert (cap["last_held"], cap["first_missed"], cap["known"]) == (37.5, 50.0, True)
    (warm / META).unlink()  # unfinished: no step at 50, so nothing bounds the capacity from above
    cap = cpu_vs_gpu.search_side(c, c.baseline, result, Progress(8))["capacity"]
    assert (cap["last_held"], cap["first_missed"], cap["known"]) == (37.5, None, False)
    assert "last held 37.5 req/s, no higher rate measured;" in _capacity_words(cap)


def test_a_capacity_whose_last_held_run_had_too_few_requests_says_so() -> None:
    from netgain.cli.experiments import _capacity_words

    def run(rate: float) -> Trial:  # a slow side: a 30 s window at ~2.7 req/s holds ~83 requests
        held = rate <= 2.8
        return Trial(
            rate, rate, 45.0, 98.0 if held else 110.0, 0, 0.0, True, "", held, samples=int(rate * 30)
        )

    cap = search(run, 50, floor=0.5, ceiling=100, precision=0.1).capacity
    assert cap.last_held is not None and cap.last_held <= 2.8 and cap.held_samples == int(cap.last_held * 30)
    assert thin(cap.held_samples)
    words = f"rests on {cap.held_samples} successful requests (a p99 needs {P99_SAMPLES}"
    assert words in cap.words() and words in _capacity_words(cap.to_dict())
    # Enough requests behind the held rate, or none recorded (older runs): nothing added.
    plenty = from_trials(
        [
            Trial(r, r, 45.0, 98.0 if r <= 20 else 110.0, 0, 0.0, True, "", r <= 20, samples=int(r * 30))
            for r in (10, 20, 22)
        ],
        floor=0.5,
        ceiling=100,
        precision=0.1,
    )
    assert (plenty.last_held, plenty.held_samples, thin(plenty.held_samples)) == (20, 600, False)
    assert "rests on" not in plenty.words() and "rests on" not in _capacity_words(plenty.to_dict())
    older = {**cap.to_dict(), "held_samples": None}
    assert "rests on" not in _capacity_words(older)
    # One wording for the progress line and the CLI's CAPACITY line, whatever the bracket.
    for c in (cap, plenty, Capacity(None, None, None, 1, 100, 0.1, 5, reached_floor=True)):
        assert Capacity.from_dict(c.to_dict()) == c and _capacity_words(c.to_dict()) == c.words()
    assert "at no rate down to 1 req/s" in _capacity_words({"reached_floor": True, "floor_rps": 1, "runs": 5})
