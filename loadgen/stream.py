"""The schedule streamed: the same requests as ``synthesize`` + ``from_trace``, made a chunk at a time.

A 24 h soak at 1,000 req/s is 86.4 M requests; held whole (index, time, size, items: ~28 B each,
more in the engines' lists) it needs gigabytes. ``StreamedSchedule`` yields the schedule in
index order, ``chunk`` requests at a time, drawing from the same seeded generators in the same
order as ``loadgen.traces.synth.synthesize``, so a seed gives bit for bit the same arrivals,
sizes, items, indices and digest (tests/test_schedule_stream.py compares them).

How each arrival model streams:

- ``constant``: ``i / rate`` for the chunk's ``i``.
- ``gamma``: the renewal process is a running sum of gaps drawn in order; drawn in blocks of the
  same chunks ``synthesize`` uses, the partial sum carried into the next block's first gap, so the
  floating-point sums are the same.
- ``poisson``, ``onoff``, ``diurnal``: sorted uniform draws. The draws are replayed from the
  generator's saved state a block at a time; a first pass counts them per time bin, then each
  window of bins (at most ``window`` draws, or one bin) is collected by a replay and sorted.
  Memory: one window; CPU: one replay of all n draws per window (n / window replays, each
  ~1 s per 100 M draws).
- sizes and items come from their own spawned generators, drawn in order a block at a time.

A recorded trace (``from_trace``) is read whole anyway; it is sliced, not copied. Looped
(``rescaled``), it is repeated a copy at a time as the schedule streams.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from netgain.loadgen.schedule import Schedule
from netgain.loadgen.traces.synth import MAX_REQUESTS, _check, parse_items, rescale, source_of

CHUNK = 4096  # requests per chunk dealt to the workers (all of them together)
WINDOW = 1 << 20  # sorted uniform draws held at once (8 MB of float64, twice while sorting)
BLOCK = 1 << 16  # draws per replayed block


def _gen(state: Any, advance: int = 0) -> np.random.Generator:
    """A generator at ``state`` (a PCG64 state, as ``bit_generator.state`` gives it), moved on by
    ``advance`` 64-bit draws (one per uniform)."""
    bg = np.random.PCG64()
    bg.state = state
    if advance:
        bg.advance(advance)
    return np.random.Generator(bg)


class _SortedUniforms:
    """``np.sort(rng.uniform(0, high, n))`` from ``state`` on, in ascending windows."""

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
        if self.n <= self.window:  # one window: a single draw, as synthesize makes it
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


class StreamedSchedule:
    """The schedule as chunks (``chunks()``), with its length, duration and digest known up front
    (one streamed pass at construction)."""

    def __init__(
        self,
        arrivals: Callable[[], Iterator[np.ndarray]],
        sizes: Callable[[int], Iterator[np.ndarray]],
        items: Callable[[int], Iterator[np.ndarray]],
        warmup_s: float,
        source: str,
    ) -> None:
        self._arrivals, self._sizes, self._items = arrivals, sizes, items
        self.warmup_ns = int(warmup_s * 1e9)
        self.source = source
        h = hashlib.sha256()
        n, last = 0, 0
        for t in self._t_ns():
            h.update(t.astype("<i8").tobytes())
            n += t.shape[0]
            last = int(t[-1]) if t.shape[0] else last
        for s in sizes(n):
            h.update(s.astype("<i8").tobytes())
        for k in items(n):
            h.update(k.astype("<i4").tobytes())
        self.n, self.last_ns, self.digest = n, last, h.hexdigest()

    def __len__(self) -> int:
        return self.n

    @property
    def duration_s(self) -> float:
        return self.last_ns / 1e9

    def _t_ns(self) -> Iterator[np.ndarray]:
        for t in self._arrivals():
            yield np.round(np.asarray(t, dtype=np.float64) * 1e9).astype(np.int64)

    def chunks(self, size: int = CHUNK) -> Iterator[Schedule]:
        """The schedule in index order, ``size`` requests a chunk (the last one shorter)."""
        ts, ss, ks = self._t_ns(), self._sizes(self.n), self._items(self.n)
        bufs: list[list[np.ndarray]] = [[], [], []]
        have = [0, 0, 0]
        start = 0
        while start < self.n:
            want = min(size, self.n - start)
            cols = []
            for c, it in enumerate((ts, ss, ks)):
                while have[c] < want:
                    a = next(it)
                    bufs[c].append(a)
                    have[c] += a.shape[0]
                joined = np.concatenate(bufs[c]) if len(bufs[c]) > 1 else bufs[c][0]
                cols.append(joined[:want])
                rest = joined[want:]
                bufs[c], have[c] = ([rest], rest.shape[0]) if rest.shape[0] else ([], 0)
            yield Schedule(
                index=np.arange(start, start + want, dtype=np.int64),
                t_ns=cols[0],
                size=cols[1].astype(np.int64, copy=False),
                items=cols[2].astype(np.int32, copy=False),
                warmup_ns=self.warmup_ns,
                digest=self.digest,
                source=self.source,
            )
            start += want


def _sliced(a: np.ndarray) -> Callable[[int], Iterator[np.ndarray]]:
    def blocks(n: int) -> Iterator[np.ndarray]:
        for i in range(0, n, BLOCK):
            yield a[i : min(n, i + BLOCK)]

    return blocks


def from_trace(trace: Any, warmup_s: float = 0.0) -> StreamedSchedule:
    """A recorded (in-memory) trace, streamed in slices: the same schedule as ``schedule.from_trace``."""
    t_s = np.asarray(trace.t_s, dtype=np.float64)
    return StreamedSchedule(
        lambda: _sliced(t_s)(t_s.shape[0]),
        _sliced(np.asarray(trace.size, dtype=np.int64)),
        _sliced(np.asarray(trace.items, dtype=np.int32)),
        warmup_s,
        str(getattr(trace, "source", "")),
    )


def _cyclic(a: np.ndarray) -> Callable[[int], Iterator[np.ndarray]]:
    """``np.tile(a, copies)[:n]`` in slices: the array over and over, never copied whole."""

    def blocks(n: int) -> Iterator[np.ndarray]:
        done = 0
        while done < n:
            for i in range(0, a.shape[0], BLOCK):
                k = min(BLOCK, a.shape[0] - i, n - done)
                if k <= 0:
                    return
                yield a[i : i + k]
                done += k

    return blocks


def rescaled(
    trace: Any, warmup_s: float = 0.0, *, rate: float | None = None, duration_s: float | None = None
) -> StreamedSchedule:
    """``from_trace(traces.rescale(trace, rate=rate, duration_s=duration_s), warmup_s)``: the same
    arrivals, sizes, items, ids and digest. When that loops the trace (a duration longer than it,
    or more requests than it has) the loop is made a copy at a time as the schedule streams, never
    the looped copy whole: memory is the trace plus a block, however many loops."""

    t = np.asarray(trace.t_s, dtype=np.float64)
    n = t.shape[0]
    loops = (
        duration_s is not None
        and n >= 2
        and float(t[-1]) > 0
        and (duration_s > t[-1] if rate is None else max(round(rate * duration_s), 2) > n)
    )
    if not loops:
        return from_trace(rescale(trace, rate=rate, duration_s=duration_s), warmup_s)
    assert duration_s is not None
    _check("duration_s", duration_s)
    span = float(t[-1])
    period = span + max(span / (n - 1) - float(t[0]), 0.0)  # as synth._loop spaces the copies
    count: int | None = None
    factor: float | None = None
    if rate is None:
        copies = math.ceil(duration_s / span) + 1
        note = f"duration_s={duration_s:g}"
    else:
        _check("rate", rate)
        count = max(round(rate * duration_s), 2)
        if count > MAX_REQUESTS:
            raise ValueError(f"rate x duration = {count:,} requests is over the limit of {MAX_REQUESTS:,}")
        copies = -(-count // n)
        k, i = divmod(count - 1, n)
        last = float(t[i]) + float(k) * period
        if last <= 0:
            raise ValueError("the first requests of this trace all arrive at 0; cannot stretch them")
        factor = duration_s / last
        note = f"rate={rate:g} duration_s={duration_s:g}"
    if copies * n > MAX_REQUESTS:
        raise ValueError(f"looping needs {copies * n:,} requests, over the limit of {MAX_REQUESTS:,}")

    def arrivals() -> Iterator[np.ndarray]:
        left = count
        for k in range(copies):
            offset = float(k) * period  # np.arange(copies) * period, one copy at a time
            for i in range(0, n, BLOCK):
                block = t[i : i + BLOCK] + offset
                if factor is not None:
                    block = block * factor
                if left is not None:
                    block = block[:left]
                    left -= block.shape[0]
                    yield block
                    if not left:
                        return
                    continue
                keep = int(np.searchsorted(block, duration_s, side="right"))
                yield block[:keep]
                if keep < block.shape[0]:
                    return

    return StreamedSchedule(
        arrivals,
        _cyclic(np.asarray(trace.size, dtype=np.int64)),
        _cyclic(np.asarray(trace.items, dtype=np.int32)),
        warmup_s,
        f"rescaled({getattr(trace, 'source', '')}) {note}",
    )


def synthesize(
    arrival: str,
    rate: float,
    duration_s: float,
    seed: int = 0,
    *,
    warmup_s: float = 0.0,
    cv: float = 2.0,
    on_s: float = 1.0,
    off_s: float = 4.0,
    period_s: float = 60.0,
    amplitude: float = 0.5,
    size_bytes: int = 0,
    size_sigma: float = 0.0,
    items: int | str = 1,
    window: int = WINDOW,
) -> StreamedSchedule:
    """``from_trace(synthesize(...), warmup_s)`` streamed: same arguments, same requests, same digest."""
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
    rate, duration_s = float(rate), float(duration_s)
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
        from netgain.loadgen.traces.synth import ARRIVALS

        raise ValueError(f"unknown arrival model {arrival!r}: choose one of {', '.join(ARRIVALS)}")

    def fresh() -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
        rng = np.random.default_rng(seed)
        size_rng, items_rng = rng.spawn(2)
        return rng, size_rng, items_rng

    def arrivals() -> Iterator[np.ndarray]:
        rng = fresh()[0]
        if arrival == "constant":
            n = math.ceil(rate * duration_s)
            for i in range(0, n, BLOCK):
                yield np.arange(i, min(n, i + BLOCK), dtype=np.float64) / rate
        elif arrival == "gamma":
            yield from _renewal(rng, 1.0 / (cv * cv), rate, duration_s)
        elif arrival == "poisson":
            n = int(rng.poisson(rate * duration_s))
            yield from _SortedUniforms(rng.bit_generator.state, n, duration_s, window)
        elif arrival == "onoff":
            cycle = on_s + off_s
            full, rest = divmod(duration_s, cycle)
            on_total = full * on_s + min(rest, on_s)
            burst_rate = rate * cycle / on_s
            n = int(rng.poisson(burst_rate * on_total))
            cap = np.nextafter(duration_s, 0)
            for u in _SortedUniforms(rng.bit_generator.state, n, on_total, window):
                k = np.floor(u / on_s)
                yield np.minimum(k * cycle + (u - k * on_s), cap)
        else:  # diurnal: candidates, then one keep/thin draw per candidate after all of them
            peak = rate * (1 + amplitude)
            n = int(rng.poisson(peak * duration_s))
            state = rng.bit_generator.state
            keep_rng = _gen(state, advance=n)  # the thinning draws come after the n candidates
            for cand in _SortedUniforms(state, n, duration_s, window):
                keep_u = keep_rng.uniform(0.0, 1.0, cand.shape[0])
                yield cand[keep_u * (1 + amplitude) < 1 + amplitude * np.sin(2 * np.pi * cand / period_s)]

    def sizes(n: int) -> Iterator[np.ndarray]:
        size_rng = fresh()[1]
        for i in range(0, n, BLOCK):
            k = min(BLOCK, n - i)
            if size_sigma > 0 and size_bytes > 0:
                yield np.rint(size_bytes * np.exp(size_sigma * size_rng.standard_normal(k))).astype(np.int64)
            else:
                yield np.full(k, int(size_bytes), dtype=np.int64)

    def items_of(n: int) -> Iterator[np.ndarray]:
        items_rng = fresh()[2]
        cdf = probs.cumsum()
        cdf /= cdf[-1]
        for i in range(0, n, BLOCK):
            k = min(BLOCK, n - i)
            if values.shape[0] > 1:  # Generator.choice(p=...): uniforms searched in the CDF
                yield values[cdf.searchsorted(items_rng.random(k), side="right")]
            else:
                yield np.full(k, int(values[0]), dtype=np.int32)

    src = source_of(
        arrival, rate, duration_s, seed, cv, on_s, off_s, period_s, amplitude, size_bytes, size_sigma, items
    )
    return StreamedSchedule(arrivals, sizes, items_of, warmup_s, src)


def _renewal(rng: np.random.Generator, shape: float, rate: float, duration_s: float) -> Iterator[np.ndarray]:
    """``synth._renewal`` with gamma gaps, a block at a time: the same chunks, the same sums."""
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
