"""The schedule streamed: the same requests as ``synthesize`` + ``from_trace``, made a chunk at a time.

A 24 h soak at 1,000 req/s is 86.4 M requests; held whole (index, time, size, items: ~28 B each,
more in the engines' lists) it needs gigabytes. ``StreamedSchedule`` yields the schedule in
index order, ``chunk`` requests at a time. A synthetic one deals out the blocks of the same
``loadgen.traces.synth.Synthetic`` model that ``synthesize`` collects, so a seed gives bit for
bit the same arrivals, sizes, items, indices and digest.

How each arrival model is drawn a block at a time (``synth.Synthetic``):

- ``constant``: ``i / rate`` for the block's ``i``.
- ``gamma``: the renewal process is a running sum of gaps drawn in order, in blocks, the partial
  sum carried into the next block's first gap, so the floating-point sums are ``np.cumsum``'s.
- ``poisson``, ``onoff``, ``diurnal``: sorted uniform draws. Streamed, the draws are replayed from
  the generator's saved state a block at a time; a first pass counts them per time bin, then each
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
from netgain.loadgen.traces.synth import BLOCK, MAX_REQUESTS, Synthetic, _check, rescale

CHUNK = 4096  # requests per chunk dealt to the workers (all of them together)
WINDOW = 1 << 20  # sorted uniform draws held at once (8 MB of float64, twice while sorting)


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
    window: int = WINDOW,
    **model: Any,
) -> StreamedSchedule:
    """``from_trace(synthesize(...), warmup_s)`` streamed: the same ``Synthetic`` model (its arguments
    in ``model``) drawn a block at a time, so the same requests and digest."""
    m = Synthetic(arrival, rate, duration_s, seed, **model)
    return StreamedSchedule(lambda: m.arrivals(window), m.sizes, m.items_of, warmup_s, m.source)
