"""Traces: the Trace type, seeded synthesis, rescaling, fitting and inspection."""

from __future__ import annotations

import numpy as np
import pytest

from netgain.loadgen.traces import (
    ARRIVALS,
    Trace,
    TraceError,
    fit,
    inspect_trace,
    params_from_fit,
    rescale,
    synthesize,
)


def _cv(trace: Trace) -> float:
    g = np.diff(trace.t_s)
    return float(g.std() / g.mean())


def test_trace_basics_and_digest() -> None:
    tr = Trace(np.array([0.0, 0.5, 2.0]), np.array([10, 0, 30]), np.array([1, 4, 1]), source="x")
    assert len(tr) == 3
    assert tr.duration_s == 2.0
    assert tr.mean_rate == 1.5
    assert tr.t_s.dtype == np.float64 and tr.size.dtype == np.int64 and tr.items.dtype == np.int32
    assert not tr.t_s.flags.writeable
    same = Trace(
        np.array([0.0, 0.5 + 1e-13, 2.0]), np.array([10, 0, 30]), np.array([1, 4, 1]), source="other"
    )
    assert same.digest() == tr.digest() and same == tr  # t rounded to ns; source does not count
    assert (
        Trace(np.array([0.0, 0.5, 2.0]), np.array([10, 0, 31]), np.array([1, 4, 1])).digest() != tr.digest()
    )
    empty = Trace(np.zeros(0), np.zeros(0), np.zeros(0))
    assert len(empty) == 0 and empty.duration_s == 0.0 and empty.mean_rate == 0.0


def test_caller_arrays_are_not_frozen() -> None:
    t = np.array([0.0, 1.0])
    Trace(t, np.zeros(2), np.ones(2))
    t[0] = 0.5  # still writable


@pytest.mark.parametrize(
    "t,size,items,field",
    [
        ([1.0, 0.5], [0, 0], [1, 1], "t"),
        ([-1.0, 0.5], [0, 0], [1, 1], "t"),
        ([0.0, 1.0], [0, -1], [1, 1], "size"),
        ([0.0, 1.0], [0, 1], [1, 0], "items"),
        ([0.0, np.nan], [0, 1], [1, 1], "t"),
    ],
)
def test_trace_rejects_invalid(t: list[float], size: list[int], items: list[int], field: str) -> None:
    with pytest.raises(TraceError) as err:
        Trace(np.array(t), np.array(size), np.array(items))
    assert err.value.field == field


@pytest.mark.parametrize("arrival", ARRIVALS)
def test_seeded_synthesis_is_exact(arrival: str) -> None:
    kw = {"size_bytes": 2000, "size_sigma": 0.8, "items": "1:0.7,4:0.2,16:0.1"}
    a = synthesize(arrival, 150, 60, seed=7, **kw)  # type: ignore[arg-type]
    b = synthesize(arrival, 150, 60, seed=7, **kw)  # type: ignore[arg-type]
    assert a.digest() == b.digest()
    assert a.source == b.source and f"synthetic:{arrival}" in a.source and "seed=7" in a.source
    assert 0.8 * 9000 < len(a) < 1.2 * 9000
    assert a.t_s[0] >= 0 and a.t_s[-1] < 60
    if arrival != "constant":
        assert synthesize(arrival, 150, 60, seed=8, **kw).digest() != a.digest()  # type: ignore[arg-type]


def test_sizes_and_items_distributions() -> None:
    tr = synthesize("poisson", 1000, 60, seed=1, size_bytes=4096, size_sigma=0.5, items="1:0.7,4:0.2,16:0.1")
    assert np.median(tr.size) == pytest.approx(4096, rel=0.03)
    assert np.log(tr.size).std() == pytest.approx(0.5, rel=0.03)
    frac = {v: float((tr.items == v).mean()) for v in (1, 4, 16)}
    assert frac[1] == pytest.approx(0.7, abs=0.01) and frac[16] == pytest.approx(0.1, abs=0.01)
    assert set(np.unique(tr.items)) == {1, 4, 16}
    fixed = synthesize("constant", 10, 5, size_bytes=100, items=8)
    assert (fixed.size == 100).all() and (fixed.items == 8).all()
    assert np.allclose(np.diff(fixed.t_s), 0.1)
    # the arrivals do not depend on the size or items model
    assert np.array_equal(
        synthesize("gamma", 100, 10, seed=3).t_s, synthesize("gamma", 100, 10, seed=3, items=4).t_s
    )


def test_synthesis_models_have_their_shape() -> None:
    assert _cv(synthesize("poisson", 500, 100, seed=2)) == pytest.approx(1.0, rel=0.05)
    assert _cv(synthesize("gamma", 500, 100, seed=2, cv=3.0)) == pytest.approx(3.0, rel=0.1)
    onoff = synthesize("onoff", 200, 100, seed=2, on_s=1.0, off_s=4.0)
    phase = np.mod(onoff.t_s, 5.0)
    assert (phase < 1.0).all()  # silent during off periods
    assert len(onoff) == pytest.approx(200 * 100, rel=0.05)  # mean rate preserved
    di = synthesize("diurnal", 400, 120, seed=2, period_s=60, amplitude=0.8)
    counts = np.bincount((di.t_s // 15).astype(int), minlength=8)
    assert counts[0] + counts[4] > 2 * (counts[2] + counts[6])  # sin > 0 in the first half of each period


def _textbook(arrival: str, rate: float, d: float, seed: int, **kw: float) -> np.ndarray:
    """The arrival model as whole-array numpy draws from the seed's generator."""
    rng = np.random.default_rng(seed)
    if arrival == "constant":
        return np.arange(np.ceil(rate * d)) / rate
    if arrival == "poisson":
        return np.sort(rng.uniform(0.0, d, int(rng.poisson(rate * d))))
    if arrival == "gamma":  # one chunk of gaps covers the duration for this cv
        shape = 1.0 / kw["cv"] ** 2
        t = np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), int(rate * d + 6 * np.sqrt(rate * d) + 16)))
        assert t[-1] >= d
        return t[t < d]
    if arrival == "onoff":
        on, cycle = kw["on_s"], kw["on_s"] + kw["off_s"]
        full, rest = divmod(d, cycle)
        on_total = full * on + min(rest, on)
        u = np.sort(rng.uniform(0.0, on_total, int(rng.poisson(rate * cycle / on * on_total))))
        k = np.floor(u / on)
        return np.minimum(k * cycle + (u - k * on), np.nextafter(d, 0))
    amp, period = kw["amplitude"], kw["period_s"]
    cand = np.sort(rng.uniform(0.0, d, int(rng.poisson(rate * (1 + amp) * d))))
    keep = rng.uniform(0.0, 1.0, cand.shape[0]) * (1 + amp) < 1 + amp * np.sin(2 * np.pi * cand / period)
    return cand[keep]


@pytest.mark.parametrize(
    ("arrival", "kw"),
    [
        ("constant", {}),
        ("poisson", {}),
        ("gamma", {"cv": 0.5}),
        ("onoff", {"on_s": 1.5, "off_s": 2.0}),
        ("diurnal", {"period_s": 7.0, "amplitude": 0.8}),
    ],
)
def test_synthetic_models_are_their_textbook_draws(arrival: str, kw: dict[str, float]) -> None:
    """A seed's trace is the whole-array numpy draws, bit for bit (drawn a block at a time: more
    than one block of 65,536 here), so traces and digests of a seed stay what they were."""
    items = {"size_bytes": 48000, "size_sigma": 0.7, "items": "1:0.7,4:0.2,16:0.1"}
    tr = synthesize(arrival, 3000.0, 30.0, 5, **kw, **items)  # type: ignore[arg-type]
    assert len(tr) > 65_536
    assert np.array_equal(tr.t_s, _textbook(arrival, 3000.0, 30.0, 5, **kw))
    size_rng, items_rng = np.random.default_rng(5).spawn(2)
    n = len(tr)
    assert np.array_equal(tr.size, np.rint(48000 * np.exp(0.7 * size_rng.standard_normal(n))))
    assert np.array_equal(tr.items, np.array([1, 4, 16])[items_rng.choice(3, size=n, p=[0.7, 0.2, 0.1])])


@pytest.mark.parametrize(
    "kw",
    [
        {"arrival": "bogus"},
        {"rate": 0},
        {"duration_s": -1},
        {"items": "1:x"},
        {"items": "0"},
        {"size_bytes": -1},
        {"arrival": "diurnal", "amplitude": 1.5},
        {"rate": 1e9, "duration_s": 1e9},
    ],
)
def test_synthesize_rejects_bad_arguments(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"arrival": "poisson", "rate": 10.0, "duration_s": 1.0, **kw}
    with pytest.raises(ValueError):
        synthesize(**args)  # type: ignore[arg-type]


def test_rescale_keeps_shape_and_hits_targets() -> None:
    tr = synthesize("gamma", 200, 60, seed=4, cv=2.0, size_bytes=10, size_sigma=1.0)
    faster = rescale(tr, rate=800)
    assert faster.mean_rate == pytest.approx(800, rel=1e-9)
    assert _cv(faster) == pytest.approx(_cv(tr), rel=1e-6)
    assert np.array_equal(faster.size, tr.size)
    longer = rescale(tr, duration_s=300)
    assert longer.duration_s <= 300 and longer.duration_s == pytest.approx(300, abs=1)
    assert longer.mean_rate == pytest.approx(tr.mean_rate, rel=0.05)
    assert _cv(longer) == pytest.approx(_cv(tr), rel=0.05)
    assert np.array_equal(longer.size[: len(tr)], tr.size)
    shorter = rescale(tr, duration_s=10)
    assert shorter.duration_s <= 10 and np.array_equal(shorter.t_s, tr.t_s[: len(shorter)])
    both = rescale(tr, rate=50, duration_s=500)
    assert (
        len(both) == 25_000 and both.duration_s == pytest.approx(500) and both.mean_rate == pytest.approx(50)
    )
    assert _cv(both) == pytest.approx(_cv(tr), rel=0.05)
    with pytest.raises(ValueError):
        rescale(tr)
    with pytest.raises(ValueError):
        rescale(tr, rate=-1)


def test_fit_recovers_poisson_rate() -> None:
    result = fit(synthesize("poisson", 250, 300, seed=11))
    assert result["poisson"]["params"]["rate"] == pytest.approx(250, rel=0.03)
    assert result["best"] == "poisson"
    assert result["poisson"]["score"] <= 1.0


def test_fit_recovers_gamma_cv() -> None:
    result = fit(synthesize("gamma", 250, 300, seed=12, cv=2.5))
    assert result["gamma"]["params"]["cv"] == pytest.approx(2.5, rel=0.1)
    assert result["gamma"]["cv_mle"] == pytest.approx(2.5, rel=0.1)
    assert result["gamma"]["params"]["rate"] == pytest.approx(250, rel=0.05)
    assert result["best"] == "gamma"


def test_fit_recovers_diurnal_period() -> None:
    result = fit(synthesize("diurnal", 200, 900, seed=13, period_s=90, amplitude=0.6))
    params = result["diurnal"]["params"]
    assert params["period_s"] == pytest.approx(90, rel=0.1)
    assert params["amplitude"] == pytest.approx(0.6, abs=0.1)
    assert result["best"] == "diurnal"


def test_fit_recovers_onoff_bursts() -> None:
    result = fit(synthesize("onoff", 100, 600, seed=14, on_s=2.0, off_s=6.0))
    params = result["onoff"]["params"]
    assert params["on_s"] == pytest.approx(2.0, rel=0.15)
    assert params["off_s"] == pytest.approx(6.0, rel=0.15)
    assert result["onoff"]["burst_rate"] == pytest.approx(400, rel=0.05)
    assert result["best"] == "onoff"


def test_fit_feeds_synthesize() -> None:
    tr = synthesize("gamma", 100, 120, seed=5, cv=1.5, size_bytes=3000, size_sigma=0.7, items="1:0.5,2:0.5")
    result = fit(tr)
    params = params_from_fit(result)
    again = synthesize(duration_s=120, seed=1, **params)
    assert params["arrival"] == "gamma"
    assert params["size_bytes"] == pytest.approx(3000, rel=0.1) and params["size_sigma"] == pytest.approx(
        0.7, rel=0.1
    )
    assert _cv(again) == pytest.approx(1.5, rel=0.1)
    with pytest.raises(ValueError):
        fit(Trace(np.array([0.0]), np.array([0]), np.array([1])))


def test_inspect_trace() -> None:
    tr = synthesize("constant", 10, 10, size_bytes=100, items="1:0.5,3:0.5", seed=0)
    info = inspect_trace(tr, bin_s=1.0)
    assert info["requests"] == 100
    assert info["mean_rate"] == pytest.approx(100 / 9.9)
    assert info["peak_rate"] == 10.0
    assert info["rate_per_bin"] == [10.0] * 10
    assert info["burstiness"]["cv_interarrival"] == pytest.approx(0.0, abs=1e-9)
    assert info["burstiness"]["index_of_dispersion"] == pytest.approx(0.0, abs=1e-9)
    assert info["interarrival_ms"]["p50"] == pytest.approx(100.0)
    assert info["size_bytes"]["p99"] == 100
    assert sum(info["items"].values()) == 100 and set(info["items"]) == {"1", "3"}
    bursty = inspect_trace(synthesize("onoff", 100, 100, seed=1), bin_s=1.0)
    assert bursty["burstiness"]["index_of_dispersion"] > 10
    assert bursty["peak_rate"] > 3 * bursty["mean_rate"]
    empty = inspect_trace(Trace(np.zeros(0), np.zeros(0), np.zeros(0)))
    assert empty["requests"] == 0 and empty["rate_per_bin"] == []
