"""Seeded synthetic traces and shape-keeping rescaling.

Every draw comes from ``numpy.random.default_rng(seed)``: arrivals from the generator
itself, sizes and items from its two spawned children, so identical arguments give an
identical trace (and digest) on every machine, and changing the size model never moves
the arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from netgain.loadgen.traces.model import Trace

ARRIVALS = ("constant", "poisson", "gamma", "onoff", "diurnal")
MAX_REQUESTS = 100_000_000


def parse_items(items: int | str) -> tuple[np.ndarray, np.ndarray]:
    """``4`` or ``"4"`` -> one value; ``"1:0.7,4:0.2,16:0.1"`` -> values and probabilities.

    Weights are normalised, so ``"1:7,4:2,16:1"`` means the same.
    """
    if isinstance(items, int | np.integer):
        values, weights = [int(items)], [1.0]
    else:
        text = str(items).strip()
        values, weights = [], []
        for part in text.split(","):
            value, sep, weight = part.strip().partition(":")
            try:
                values.append(int(value))
                weights.append(float(weight) if sep else 1.0)
            except ValueError:
                raise ValueError(
                    f"items {text!r}: expected an integer or 'N:P,N:P,...' such as '1:0.7,4:0.2,16:0.1'"
                ) from None
    v = np.asarray(values, dtype=np.int32)
    w = np.asarray(weights, dtype=np.float64)
    if (v < 1).any():
        raise ValueError(f"items {items!r}: items per request must be >= 1")
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"items {items!r}: probabilities must be >= 0 and not all zero")
    return v, w / w.sum()


def _check(name: str, value: float, *, positive: bool = True) -> None:
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


BLOCK = 1 << 16  # draws made at a time


def _gen(state: Any, advance: int = 0) -> np.random.Generator:
    """A generator at ``state`` (a PCG64 state, as ``bit_generator.state`` gives it), moved on by
    ``advance`` 64-bit draws (one per uniform)."""
    bg = np.random.PCG64()
    bg.state = state
    if advance:
        bg.advance(advance)
    return np.random.Generator(bg)


class _SortedUniforms:
    """``np.sort(rng.uniform(0, high, n))`` from ``state`` on, in ascending windows of at most
    ``window`` draws: replayed from the saved state a block at a time, counted per time bin on a
    first pass, then each window of bins collected by a replay and sorted."""

    def __init__(self, state: Any, n: int, high: float, window: int) -> None:
        self.state, self.n, self.high, self.window = state, n, high, max(1, window)
        self._counts: np.ndarray | None = None
        self._edges: np.ndarray | None = None

    def _blocks(self) -> Iterator[np.ndarray]:
        g = _gen(self.state)
        left = self.n
        while left > 0:
            k = min(BLOCK, left)
            yield g.uniform(0.0, self.high, k)
            left -= k

    def _bins(self) -> tuple[np.ndarray, np.ndarray]:
        if self._counts is None or self._edges is None:
            bins = int(min(max(1, math.ceil(8 * self.n / self.window)), 1 << 22))
            edges = np.arange(bins + 1, dtype=np.float64) * (self.high / bins)
            edges[0], edges[-1] = -np.inf, np.inf
            counts = np.zeros(bins, dtype=np.int64)
            for u in self._blocks():
                counts += np.bincount(np.searchsorted(edges, u, side="right") - 1, minlength=bins)
            self._counts, self._edges = counts, edges
        return self._counts, self._edges

    def __iter__(self) -> Iterator[np.ndarray]:
        if self.n <= self.window:  # one window: a single draw, sorted
            if self.n:
                yield np.sort(_gen(self.state).uniform(0.0, self.high, self.n))
            return
        counts, edges = self._bins()
        k = 0
        while k < counts.shape[0]:
            end, got = k + 1, int(counts[k])
            while end < counts.shape[0] and got + int(counts[end]) <= self.window:
                got += int(counts[end])
                end += 1
            if got:
                lo, hi = edges[k], edges[end]
                parts = [u[(u >= lo) & (u < hi)] for u in self._blocks()]
                yield np.sort(np.concatenate(parts))
            k = end


def _renewal(rng: np.random.Generator, shape: float, rate: float, duration_s: float) -> Iterator[np.ndarray]:
    """Arrivals of a renewal process with gamma gaps (first arrival after one gap) in
    [0, duration_s): running sums of gaps drawn in chunks, a block at a time, the partial sum
    carried into the next block's first gap (so the sums are ``np.cumsum``'s over the chunk)."""
    expected = rate * duration_s
    chunk = int(expected + 6 * math.sqrt(expected) + 16)
    last = 0.0
    while True:
        partial, tail = 0.0, last
        for i in range(0, chunk, BLOCK):
            g = rng.gamma(shape, 1.0 / (rate * shape), min(BLOCK, chunk - i))
            if i:
                g[0] += partial  # cumsum's running sum goes on from the previous block
            s = np.cumsum(g)
            partial = float(s[-1])
            t = last + s
            tail = float(t[-1])
            if tail >= duration_s:
                yield t[t < duration_s]
                return
            yield t
        last = tail
        chunk = max(chunk // 4, 1024)


class Synthetic:
    """A seeded synthetic traffic model, its arguments checked, its requests drawn a block at a
    time: ``trace()`` collects them into a Trace, ``stream.synthesize`` deals them out in chunks.

    ``arrival`` traffic at mean ``rate`` req/s for ``duration_s`` seconds. constant: every 1/rate
    s; poisson: exponential inter-arrivals; gamma: gamma inter-arrivals with coefficient of
    variation ``cv`` (1 = Poisson, > 1 bursty, < 1 regular); onoff: Poisson at
    rate*(on_s+off_s)/on_s for ``on_s`` seconds, then ``off_s`` seconds of silence, repeating from
    an on period at 0; diurnal: Poisson with rate*(1 + amplitude*sin(2*pi*t/period_s)) by thinning.
    Sizes: ``size_bytes`` fixed, or lognormal with median ``size_bytes`` and sigma ``size_sigma``.
    Items: an int, or a distribution "1:0.7,4:0.2,16:0.1".
    """

    def __init__(
        self,
        arrival: str,
        rate: float,
        duration_s: float,
        seed: int = 0,
        *,
        cv: float = 2.0,
        on_s: float = 1.0,
        off_s: float = 4.0,
        period_s: float = 60.0,
        amplitude: float = 0.5,
        size_bytes: int = 0,
        size_sigma: float = 0.0,
        items: int | str = 1,
    ) -> None:
        _check("rate", rate)
        _check("duration_s", duration_s)
        if rate * duration_s > MAX_REQUESTS:
            raise ValueError(
                f"rate x duration = {rate * duration_s:.3g} requests is over the limit of "
                f"{MAX_REQUESTS:,}; lower the rate or the duration"
            )
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        _check("size_sigma", size_sigma, positive=False)
        self.values, self.probs = parse_items(items)
        if arrival == "gamma":
            _check("cv", cv)
        elif arrival == "onoff":
            _check("on_s", on_s)
            _check("off_s", off_s, positive=False)
        elif arrival == "diurnal":
            _check("period_s", period_s)
            if not 0 <= amplitude <= 1:
                raise ValueError(f"amplitude must be within 0..1, got {amplitude!r}")
        elif arrival not in ("constant", "poisson"):
            raise ValueError(f"unknown arrival model {arrival!r}: choose one of {', '.join(ARRIVALS)}")
        self.arrival, self.rate, self.duration_s, self.seed = arrival, float(rate), float(duration_s), seed
        self.cv, self.on_s, self.off_s, self.period_s, self.amplitude = cv, on_s, off_s, period_s, amplitude
        self.size_bytes, self.size_sigma = size_bytes, size_sigma
        shape = (cv, on_s, off_s, period_s, amplitude)
        self.source = source_of(arrival, rate, duration_s, seed, *shape, size_bytes, size_sigma, items)

    def _rngs(self) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
        """Arrivals from the seed's generator, sizes and items from its two spawned children:
        each column is drawn afresh in order, and the size model never moves the arrivals."""
        rng = np.random.default_rng(self.seed)
        size_rng, items_rng = rng.spawn(2)
        return rng, size_rng, items_rng

    def arrivals(self, window: int) -> Iterator[np.ndarray]:
        """Arrival offsets in seconds, ascending, a block at a time; sorted uniform draws are made
        ``window`` at a time (the same values whatever the window)."""
        rng, rate, duration_s = self._rngs()[0], self.rate, self.duration_s
        if self.arrival == "constant":
            n = math.ceil(rate * duration_s)
            for i in range(0, n, BLOCK):
                yield np.arange(i, min(n, i + BLOCK), dtype=np.float64) / rate
        elif self.arrival == "gamma":
            yield from _renewal(rng, 1.0 / (self.cv * self.cv), rate, duration_s)
        elif self.arrival == "poisson":
            n = int(rng.poisson(rate * duration_s))
            yield from _SortedUniforms(rng.bit_generator.state, n, duration_s, window)
        elif self.arrival == "onoff":
            on_s, cycle = self.on_s, self.on_s + self.off_s
            full, rest = divmod(duration_s, cycle)
            on_total = full * on_s + min(rest, on_s)
            burst_rate = rate * cycle / on_s
            n = int(rng.poisson(burst_rate * on_total))
            cap = np.nextafter(duration_s, 0)
            for u in _SortedUniforms(rng.bit_generator.state, n, on_total, window):
                k = np.floor(u / on_s)
                yield np.minimum(k * cycle + (u - k * on_s), cap)
        else:  # diurnal: candidates, then one keep/thin draw per candidate after all of them
            amplitude, period_s = self.amplitude, self.period_s
            peak = rate * (1 + amplitude)
            n = int(rng.poisson(peak * duration_s))
            state = rng.bit_generator.state
            keep_rng = _gen(state, advance=n)  # the thinning draws come after the n candidates
            for cand in _SortedUniforms(state, n, duration_s, window):
                keep_u = keep_rng.uniform(0.0, 1.0, cand.shape[0])
                yield cand[keep_u * (1 + amplitude) < 1 + amplitude * np.sin(2 * np.pi * cand / period_s)]

    def sizes(self, n: int) -> Iterator[np.ndarray]:
        """The first ``n`` payload sizes, a block at a time."""
        size_rng, size_bytes, sigma = self._rngs()[1], self.size_bytes, self.size_sigma
        for i in range(0, n, BLOCK):
            k = min(BLOCK, n - i)
            if sigma > 0 and size_bytes > 0:
                yield np.rint(size_bytes * np.exp(sigma * size_rng.standard_normal(k))).astype(np.int64)
            else:
                yield np.full(k, int(size_bytes), dtype=np.int64)

    def items_of(self, n: int) -> Iterator[np.ndarray]:
        """The first ``n`` items per request, a block at a time."""
        items_rng, values = self._rngs()[2], self.values
        cdf = self.probs.cumsum()
        cdf /= cdf[-1]
        for i in range(0, n, BLOCK):
            k = min(BLOCK, n - i)
            if values.shape[0] > 1:  # Generator.choice(p=...): uniforms searched in the CDF
                yield values[cdf.searchsorted(items_rng.random(k), side="right")]
            else:
                yield np.full(k, int(values[0]), dtype=np.int32)

    def trace(self) -> Trace:
        """Every request, collected (the sorted draws in one window)."""
        t = _collect(self.arrivals(window=MAX_REQUESTS), np.float64)
        n = t.shape[0]
        size, items = _collect(self.sizes(n), np.int64), _collect(self.items_of(n), np.int32)
        return Trace(t, size, items, source=self.source)


def _collect(blocks: Iterable[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate([np.empty(0, dtype=dtype), *blocks]).astype(dtype, copy=False)


def synthesize(arrival: str, rate: float, duration_s: float, seed: int = 0, **model: Any) -> Trace:
    """A seeded synthetic trace: ``Synthetic(arrival, rate, duration_s, seed, **model).trace()``
    (the models and their arguments: ``Synthetic``). Identical arguments give an identical trace
    (and digest) on every machine."""
    return Synthetic(arrival, rate, duration_s, seed, **model).trace()


def source_of(
    arrival: str,
    rate: float,
    duration_s: float,
    seed: int,
    cv: float,
    on_s: float,
    off_s: float,
    period_s: float,
    amplitude: float,
    size_bytes: int,
    size_sigma: float,
    items: int | str,
) -> str:
    """The ``source`` line of a synthetic trace: the model and the arguments that made it."""
    extra = {
        "gamma": f" cv={cv:g}",
        "onoff": f" on_s={on_s:g} off_s={off_s:g}",
        "diurnal": f" period_s={period_s:g} amplitude={amplitude:g}",
    }.get(arrival, "")
    sizes = (
        f" size_bytes={size_bytes}" + (f" size_sigma={size_sigma:g}" if size_sigma > 0 else "")
        if size_bytes
        else ""
    )
    return f"synthetic:{arrival} rate={rate:g} duration_s={duration_s:g} seed={seed}{extra}{sizes}" + (
        f" items={items}" if str(items) != "1" else ""
    )


def _loop(t: np.ndarray, size: np.ndarray, items: np.ndarray, copies: int) -> tuple[np.ndarray, ...]:
    """The trace repeated ``copies`` times, each copy one mean inter-arrival after the previous one's
    last request (or ``t[0]`` after it, when the trace starts later than that)."""
    n = t.shape[0]
    if copies * n > MAX_REQUESTS:
        raise ValueError(f"looping needs {copies * n:,} requests, over the limit of {MAX_REQUESTS:,}")
    span = float(t[-1])
    period = span + max(span / (n - 1) - float(t[0]), 0.0)
    offsets = np.repeat(np.arange(copies, dtype=np.float64) * period, n)
    return np.tile(t, copies) + offsets, np.tile(size, copies), np.tile(items, copies)


def rescale(trace: Trace, *, rate: float | None = None, duration_s: float | None = None) -> Trace:
    """Keep the shape (the order and relative spacing of arrivals), change the scale.

    rate only: stretch time by mean_rate/rate. duration only: cut at ``duration_s``, or loop the
    trace end to end until it lasts that long; the rate stays about the same. Both: take the first
    round(rate * duration_s) requests (looping as needed) and stretch them to end exactly at
    ``duration_s``, so the result has exactly the target mean rate and duration.
    """
    if rate is None and duration_s is None:
        raise ValueError("rescale needs a target rate, a target duration, or both")
    if rate is not None:
        _check("rate", rate)
    if duration_s is not None:
        _check("duration_s", duration_s)
    n = len(trace)
    if n < 2 or trace.duration_s <= 0:
        raise ValueError(f"cannot rescale a trace of {n} request(s) spanning {trace.duration_s} s")
    t, size, items = trace.t_s, trace.size, trace.items
    if rate is not None and duration_s is None:
        t = t * (trace.mean_rate / rate)
        note = f"rate={rate:g}"
    elif rate is None and duration_s is not None:
        if duration_s > t[-1]:
            t, size, items = _loop(t, size, items, math.ceil(duration_s / float(t[-1])) + 1)
        keep = int(np.searchsorted(t, duration_s, side="right"))
        t, size, items = t[:keep], size[:keep], items[:keep]
        note = f"duration_s={duration_s:g}"
    else:
        assert rate is not None and duration_s is not None
        m = max(round(rate * duration_s), 2)
        if m > MAX_REQUESTS:
            raise ValueError(f"rate x duration = {m:,} requests is over the limit of {MAX_REQUESTS:,}")
        if m > n:
            t, size, items = _loop(t, size, items, -(-m // n))
        t, size, items = t[:m], size[:m], items[:m]
        if t[-1] <= 0:
            raise ValueError("the first requests of this trace all arrive at 0; cannot stretch them")
        t = t * (duration_s / float(t[-1]))
        note = f"rate={rate:g} duration_s={duration_s:g}"
    return Trace(t, size, items, source=f"rescaled({trace.source}) {note}")
