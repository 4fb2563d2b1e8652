"""netgain.stats.select: the exact order statistics of a stream in bounded memory equal the sorted
array's at every wanted rank, whatever the values (ties, one value, negatives, NaNs, wide ranges),
and each pass keeps at most the budget's values."""

from __future__ import annotations

import numpy as np
import pytest

from netgain.stats.select import Selector, from_key, keys, top_bucket

RNG = np.random.default_rng(11)
CASES = {
    "lognormal": RNG.lognormal(0.0, 0.8, 50_000),
    "microsecond ticks": np.round(RNG.exponential(5.0, 50_000), 3),
    "one value": np.full(20_000, 2.5),
    "negatives": RNG.normal(0.0, 1.0, 30_000),
    "with NaNs": np.where(RNG.random(30_000) < 0.1, np.nan, RNG.random(30_000)),
    "wide range": np.concatenate([RNG.uniform(1e-9, 1e-6, 5_000), RNG.uniform(1e3, 1e9, 5_000), [np.inf]]),
    "two values": np.tile([1.0, 7.0], 10_000),
}


def _run(values: np.ndarray, ranks: list[int], budget: int, chunks: int = 7) -> Selector:
    sel = Selector(budget=budget)
    sel.want(ranks[: len(ranks) // 2], urgent=True)
    sel.want(ranks)
    peak = 0
    while True:
        for part in np.array_split(values, chunks):
            sel.add(part)
        peak = max(peak, sum(len(k) for k in sel._kept))
        if not sel.next_pass():
            break
    assert peak <= budget
    return sel


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("budget", [64, 4_000_000])
def test_every_wanted_rank_is_the_sorted_value(name: str, budget: int) -> None:
    """Whether a bucket is kept at once or counted again first, the value is the sort's."""
    values = CASES[name]
    n = len(values)
    ranks = sorted({0, n - 1, n // 2, *np.linspace(0, n - 1, 300).astype(int), *RNG.integers(0, n, 50)})
    sel = _run(values, ranks, budget)
    ref = np.sort(values)
    for r in ranks:
        got, want = sel.value(r), ref[r]
        assert (np.isnan(got) and np.isnan(want)) or got == want, (name, r, got, want)
    assert sel.n == int((~np.isnan(values)).sum())
    assert sel.total == n


def test_an_empty_stream_answers_nan() -> None:
    """No value: every wanted rank reads NaN after the first pass."""
    sel = Selector()
    sel.want([0, 3])
    sel.add(np.zeros(0))
    assert not sel.next_pass()
    assert np.isnan(sel.value(0)) and np.isnan(sel.value(3))


def test_keys_keep_the_order_of_the_floats() -> None:
    """The keys sort as the floats do, back-convert exactly, and their top bits are the buckets."""
    v = np.concatenate([RNG.normal(0, 1e3, 1000), [-np.inf, -0.0, 0.0, 1e-300, np.inf]])
    k = keys(v)
    assert np.all(np.diff(v[np.argsort(k)]) >= 0)
    assert all(from_key(int(x)) == y for x, y in zip(k, v, strict=True))
    assert np.array_equal(top_bucket(v), (k >> np.uint64(44)).astype(np.int64))
