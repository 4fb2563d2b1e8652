"""Seeded synthetic traces and shape-keeping rescaling.

Every draw comes from ``numpy.random.default_rng(seed)``: arrivals from the generator
itself, sizes and items from its two spawned children, so identical arguments give an
identical trace (and digest) on every machine, and changing the size model never moves
the arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def _renewal(
    rng: np.random.Generator, draw_gaps: Callable[[int], np.ndarray], rate: float, duration_s: float
) -> np.ndarray:
    """Arrivals of a renewal process (first arrival after one gap) in [0, duration_s)."""
    expected = rate * duration_s
    chunk = int(expected + 6 * math.sqrt(expected) + 16)
    parts: list[np.ndarray] = []
    last = 0.0
    while True:
        t = last + np.cumsum(draw_gaps(chunk))
        parts.append(t)
        if t.shape[0] and t[-1] >= duration_s:
            break
        last = float(t[-1]) if t.shape[0] else last
        chunk = max(chunk // 4, 1024)
    t = np.concatenate(parts)
    return t[t < duration_s]


def _arrivals(
    arrival: str,
    rng: np.random.Generator,
    rate: float,
    duration_s: float,
    cv: float,
    on_s: float,
    off_s: float,
    period_s: float,
    amplitude: float,
) -> np.ndarray:
    if arrival == "constant":
        return np.arange(math.ceil(rate * duration_s), dtype=np.float64) / rate
    if arrival == "poisson":
        n = int(rng.poisson(rate * duration_s))
        return np.sort(rng.uniform(0.0, duration_s, n))
    if arrival == "gamma":
        _check("cv", cv)
        shape = 1.0 / (cv * cv)
        return _renewal(rng, lambda k: rng.gamma(shape, 1.0 / (rate * shape), k), rate, duration_s)
    if arrival == "onoff":
        _check("on_s", on_s)
        _check("off_s", off_s, positive=False)
        cycle = on_s + off_s
        full, rest = divmod(duration_s, cycle)
        on_total = full * on_s + min(rest, on_s)
        burst_rate = rate * cycle / on_s
        u = np.sort(rng.uniform(0.0, on_total, int(rng.poisson(burst_rate * on_total))))
        k = np.floor(u / on_s)
        return np.minimum(k * cycle + (u - k * on_s), np.nextafter(duration_s, 0))
    if arrival == "diurnal":
        _check("period_s", period_s)
        if not 0 <= amplitude <= 1:
            raise ValueError(f"amplitude must be within 0..1, got {amplitude!r}")
        peak = rate * (1 + amplitude)
        cand = np.sort(rng.uniform(0.0, duration_s, int(rng.poisson(peak * duration_s))))
        keep = rng.uniform(0.0, 1.0, cand.shape[0]) * (1 + amplitude) < 1 + amplitude * np.sin(
            2 * np.pi * cand / period_s
        )
        return cand[keep]
    raise ValueError(f"unknown arrival model {arrival!r}: choose one of {', '.join(ARRIVALS)}")


def synthesize(
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
) -> Trace:
    """A seeded synthetic trace of ``arrival`` traffic at mean ``rate`` req/s for ``duration_s`` seconds.

    constant: every 1/rate s; poisson: exponential inter-arrivals; gamma: gamma inter-arrivals
    with coefficient of variation ``cv`` (1 = Poisson, > 1 bursty, < 1 regular); onoff: Poisson at
    rate*(on_s+off_s)/on_s for ``on_s`` seconds, then ``off_s`` seconds of silence, repeating from
    an on period at 0; diurnal: Poisson with rate*(1 + amplitude*sin(2*pi*t/period_s)) by thinning.
    Sizes: ``size_bytes`` fixed, or lognormal with median ``size_bytes`` and sigma ``size_sigma``.
    Items: an int, or a distribution "1:0.7,4:0.2,16:0.1".
    """
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
    values, probs = parse_items(items)
    rng = np.random.default_rng(seed)
    size_rng, items_rng = rng.spawn(2)
    t = _arrivals(arrival, rng, float(rate), float(duration_s), cv, on_s, off_s, period_s, amplitude)
    n = t.shape[0]
    if size_sigma > 0 and size_bytes > 0:
        size = np.rint(size_bytes * np.exp(size_sigma * size_rng.standard_normal(n))).astype(np.int64)
    else:
        size = np.full(n, int(size_bytes), dtype=np.int64)
    item_arr = (
        values[items_rng.choice(values.shape[0], size=n, p=probs)]
        if values.shape[0] > 1
        else np.full(n, int(values[0]), dtype=np.int32)
    )
    source = source_of(
        arrival, rate, duration_s, seed, cv, on_s, off_s, period_s, amplitude, size_bytes, size_sigma, items
    )
    return Trace(t, size, item_arr, source=source)


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
