"""Statistics with known answers: exact percentiles, the binomial bound, the bootstrap shortcut."""

from __future__ import annotations

import numpy as np
import pytest
from analysis_reference import binomial_bound

from netgain.analysis import stats


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001, 12345])
def test_percentiles_match_numpy_nearest_rank(n: int) -> None:
    x = np.sort(np.random.default_rng(n).lognormal(size=n))
    got = stats.summarize(x)
    for key, q in stats.QUANTILES.items():
        assert got[key] == np.percentile(x, q * 100, method="inverted_cdf"), key
    assert got["max"] == x.max()


def test_percentile_of_empty_is_none() -> None:
    assert stats.summarize(np.empty(0)) == {k: None for k in (*stats.QUANTILES, "max")}


def test_phase_stats_ignore_nan() -> None:
    v = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, np.nan])
    s = stats.phase_stats(v)
    assert s == {"mean": 2.5, "p50": 2.0, "p90": 4.0, "p99": 4.0, "max": 4.0, "n": 4}


@pytest.mark.parametrize(("n", "q"), [(298, 0.99), (299, 0.99), (500, 0.99), (1000, 0.9), (2995, 0.999)])
def test_enough_samples_matches_brute_force_binomial(n: int, q: float) -> None:
    x = np.arange(1, n + 1, dtype=float)  # sorted[k-1] == k
    e = stats.enough_samples(x, q)
    # brute force: smallest k with P(S >= k) <= 0.05
    k = binomial_bound(n, q)
    assert e["enough"] == (k is not None)
    assert e["upper_bound_ms"] == (float(k) if k else None)
    assert e["samples_above"] == n - (stats.rank(n, q) + 1)


def test_minimum_samples_for_p99_and_p999() -> None:
    assert stats.enough_samples(np.arange(298.0), 0.99)["enough"] is False
    assert stats.enough_samples(np.arange(299.0), 0.99)["enough"] is True
    assert stats.enough_samples(np.arange(299.0), 0.99)["min_samples"] == 299
    assert stats.enough_samples(np.arange(2994.0), 0.999)["enough"] is False
    assert stats.enough_samples(np.arange(2995.0), 0.999)["min_samples"] == 2995


def test_bootstrap_quantile_matches_row_bootstrap() -> None:
    rng = np.random.default_rng(1)
    x = np.sort(rng.exponential(size=2000))
    fast = stats.bootstrap_quantile(x, 0.99, 4000, np.random.default_rng(2))
    slow = np.array([np.percentile(rng.choice(x, x.size), 99, method="inverted_cdf") for _ in range(4000)])
    assert abs(np.mean(fast) - np.mean(slow)) < 0.03 * np.mean(slow)
    assert abs(np.std(fast) - np.std(slow)) < 0.1 * np.std(slow)
    # seeded: same seed, same draws
    again = stats.bootstrap_quantile(x, 0.99, 4000, np.random.default_rng(2))
    assert np.array_equal(fast, again)


def test_bootstrap_rate_and_interval() -> None:
    counts = np.full(30, 100.0)
    draws = stats.bootstrap_rate(counts, 1.0, 50, np.random.default_rng(0))
    assert np.all(draws == 100.0)
    assert stats.interval(draws) == [100.0, 100.0]
    assert stats.interval(np.empty(0)) is None


def test_drift_and_slope() -> None:
    t = np.arange(100.0)
    lat = np.where(t < 50, 1.0, 3.0)
    d = stats.drift(lat, t)
    assert (d["first_half_p50_ms"], d["second_half_p50_ms"], d["ratio"]) == (1.0, 3.0, 3.0)
    assert stats.slope(t, 2 * t + 1) == pytest.approx(2.0)
    assert stats.slope(np.array([1.0]), np.array([5.0])) == 0.0
