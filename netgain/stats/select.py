"""Exact order statistics of a stream of float64 values in bounded memory, over a few passes.

The same numbers ``np.sort(values)[ranks]`` gives (so the nearest-rank percentiles of
``netgain.stats.quantiles``), with memory independent of how many values stream past. Each value
maps to an unsigned 64-bit key in the floats' order. The first pass counts keys in 2**20 buckets
(their top 20 bits: buckets about 0.4 % wide); every later pass either collects the values of the
buckets holding a wanted rank, when they fit ``budget``, or counts a bucket again in 4096
sub-buckets (12 more bits), until every wanted rank lies in a collected bucket or a single key.
A rank's value then is its place among the collected values, offset by the counts below.

NaNs are counted apart and sort last, as ``np.sort`` puts them: a rank past the valid values is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

TOP_BITS = 20
SUB_BITS = 12
_SIGN = np.uint64(1 << 63)
_LOW = np.int64(0x7FFF_FFFF_FFFF_FFFF)


def keys(values: np.ndarray) -> np.ndarray:
    """float64 (no NaN) → uint64 keys in the same order (negative floats' bits flipped)."""
    b = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    return (b ^ ((b >> np.int64(63)) & _LOW)).view(np.uint64) ^ _SIGN


def top_bucket(values: np.ndarray) -> np.ndarray:
    """``keys(values) >> (64 - TOP_BITS)`` as int64, in fewer array operations."""
    b = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    signed = b ^ ((b >> np.int64(63)) & _LOW)  # the key with its sign bit flipped back
    return np.asarray((signed >> np.int64(64 - TOP_BITS)) + np.int64(1 << (TOP_BITS - 1)))


def from_key(key: int) -> float:
    """The float64 a key came from."""
    s = np.array([key], dtype=np.uint64) ^ _SIGN
    b = s.view(np.int64)
    return float((b ^ ((b >> np.int64(63)) & _LOW)).view(np.float64)[0])


@dataclass
class _Interval:
    """Keys [lo, lo + width) holding some wanted ranks; ``below`` valid values lie under lo."""

    lo: int
    width: int
    below: int
    count: int
    ranks: list[int]
    collect: bool = False
    urgent: bool = False

    @property
    def shift(self) -> int:
        return max(0, (self.width - 1).bit_length() - SUB_BITS)


@dataclass
class Selector:
    """Feed every value with ``add`` once per pass; between passes ``next_pass`` says whether
    another is needed; ``value(rank)`` reads a wanted rank once ``done``. ``sum`` and ``n`` (valid
    values) come from the first pass."""

    budget: int = 4_000_000
    n: int = 0
    nan: int = 0
    sum: float = 0.0
    _top: np.ndarray | None = None
    _wanted: set[int] = field(default_factory=set)
    _urgent: set[int] = field(default_factory=set)
    _intervals: list[_Interval] = field(default_factory=list)
    _los: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    _lasts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    _collect: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _shifts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    _active: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _mins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    _maxs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    _sub: np.ndarray | None = None
    _kept: list[np.ndarray] = field(default_factory=list)
    _answers: dict[int, float] = field(default_factory=dict)
    passes: int = 0
    done: bool = False

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        if self.done:
            return
        nan = np.isnan(v)
        n_nan = int(np.count_nonzero(nan))
        if n_nan:
            v = v[~nan]
        if self.passes == 0:
            self.nan += n_nan
            self.n += len(v)
            self.sum += float(v.sum())
            if self._top is None:
                self._top = np.zeros(1 << TOP_BITS, dtype=np.int64)
            if len(v):
                self._top += np.bincount(top_bucket(v), minlength=1 << TOP_BITS)
            return
        if not len(v) or not len(self._los):
            return
        v = v[self._active[top_bucket(v)]]  # most values lie in no wanted bucket: drop them cheaply
        k = keys(v)
        pos = np.searchsorted(self._los, k, side="right").astype(np.int64) - 1
        inside = pos >= 0
        inside[inside] = k[inside] <= self._lasts[pos[inside]]
        if not inside.any():
            return
        k, pos, v = k[inside], pos[inside], v[inside]
        collect = self._collect[pos]
        if collect.any():
            self._kept.append(v[collect])
        if self._sub is not None and not collect.all():
            k, pos = k[~collect], pos[~collect]
            local = ((k - self._los[pos]) >> self._shifts[pos]).astype(np.int64)
            self._sub += np.bincount(pos * (1 << SUB_BITS) + local, minlength=self._sub.size)
            # each counted bucket's smallest and largest key: a bucket of one repeated value is
            # answered after this pass instead of after four more
            np.minimum.at(self._mins, pos, k)
            np.maximum.at(self._maxs, pos, k)

    def want(self, ranks: Iterable[int], urgent: bool = False) -> None:
        """Ranks (0-based, over valid and NaN values sorted NaN last) to read after the passes;
        ``urgent`` ones take the collection budget first (a later step waits on them)."""
        rs = [int(r) for r in ranks]
        self._wanted.update(rs)
        if urgent:
            self._urgent.update(rs)

    def bracket(self, rank: int) -> tuple[float, float, int] | None:
        """During a pass: the range [low, high] holding the rank's value, how many values lie in it,
        and so whether the pass ends with it known (a kept bucket, or a value already answered:
        (value, value, 0)); None when it needs more passes."""
        if rank in self._answers:
            v = self._answers[rank]
            return v, v, 0
        for iv in self._intervals:
            if iv.collect and rank in iv.ranks:
                return from_key(iv.lo), from_key(iv.lo + iv.width - 1), iv.count
        return None

    def known(self, ranks: Iterable[int]) -> bool:
        """Whether every one of these ranks has its value."""
        return all(int(r) in self._answers for r in ranks)

    def next_pass(self) -> bool:
        """Close a pass: narrow each wanted rank's interval; True while another pass is needed."""
        if self.done:
            return False
        self.passes += 1
        for r in self._wanted:
            if r >= self.n:
                self._answers[r] = math.nan
        wanted = sorted(r for r in self._wanted if r < self.n)
        if self.passes == 1:
            assert self._top is not None or not wanted
            nxt = self._split_top(wanted) if wanted else []
            self._top = None
        else:
            nxt = self._narrow()
        self._plan(nxt)
        self.done = not self._intervals
        return not self.done

    def _split_top(self, wanted: list[int]) -> list[_Interval]:
        assert self._top is not None
        cum = np.cumsum(self._top)
        out: dict[int, _Interval] = {}
        width = 1 << (64 - TOP_BITS)
        for r in wanted:
            b = int(np.searchsorted(cum, r + 1, side="left"))
            if b not in out:
                below = int(cum[b - 1]) if b else 0
                out[b] = _Interval(b * width, width, below, int(self._top[b]), [])
            out[b].ranks.append(r)
        return list(out.values())

    def _narrow(self) -> list[_Interval]:
        """Answer the collected intervals; split the counted ones by their sub-bucket counts."""
        kept = np.sort(np.concatenate(self._kept)) if self._kept else np.zeros(0)
        self._kept = []
        offset = 0
        out: list[_Interval] = []
        for i, iv in enumerate(self._intervals):
            if iv.collect:
                for r in iv.ranks:
                    self._answers[r] = float(kept[offset + r - iv.below])
                offset += iv.count
                continue
            assert self._sub is not None
            counts = self._sub[i * (1 << SUB_BITS) : (i + 1) * (1 << SUB_BITS)]
            cum = np.cumsum(counts)
            parts: dict[int, _Interval] = {}
            step = 1 << iv.shift
            for r in iv.ranks:
                j = int(np.searchsorted(cum, r - iv.below + 1, side="left"))
                if j not in parts:
                    below = iv.below + (int(cum[j - 1]) if j else 0)
                    lo = max(iv.lo + j * step, int(self._mins[i]))
                    last = min(iv.lo + j * step + min(step, iv.width - j * step) - 1, int(self._maxs[i]))
                    parts[j] = _Interval(lo, last - lo + 1, below, int(counts[j]), [])
                parts[j].ranks.append(r)
            out.extend(parts.values())
        if offset != len(kept):
            raise RuntimeError("the values changed between passes: the file was rewritten while read")
        self._sub = None
        return out

    def _plan(self, intervals: list[_Interval]) -> None:
        """Single keys are answered now; the smallest intervals are collected up to the budget; the
        rest are counted again, more finely."""
        pending = []
        for iv in intervals:
            if iv.width == 1:
                v = from_key(iv.lo)
                for r in iv.ranks:
                    self._answers[r] = v
            else:
                pending.append(iv)
        for iv in pending:
            iv.urgent = any(r in self._urgent for r in iv.ranks)
        room = self.budget
        for iv in sorted(pending, key=lambda x: (not x.urgent, x.count)):
            if iv.count <= room:
                iv.collect = True
                room -= iv.count
        pending.sort(key=lambda x: x.lo)
        self._intervals = pending
        self._los = np.array([iv.lo for iv in pending], dtype=np.uint64)
        self._lasts = np.array([iv.lo + iv.width - 1 for iv in pending], dtype=np.uint64)
        self._collect = np.array([iv.collect for iv in pending], dtype=bool)
        self._shifts = np.array([iv.shift for iv in pending], dtype=np.uint64)
        self._active = np.zeros(1 << TOP_BITS, dtype=bool)
        for iv in pending:
            self._active[iv.lo >> (64 - TOP_BITS)] = True
        n_sub = sum(1 for iv in pending if not iv.collect)
        self._sub = np.zeros(len(pending) * (1 << SUB_BITS), dtype=np.int64) if n_sub else None
        self._mins = np.full(len(pending), np.iinfo(np.uint64).max, dtype=np.uint64)
        self._maxs = np.zeros(len(pending), dtype=np.uint64)

    def value(self, rank: int) -> float:
        """The rank-th smallest value (0-based, NaN last); the rank must have been wanted."""
        return self._answers[int(rank)]

    @property
    def total(self) -> int:
        """Values seen in the first pass, NaNs included."""
        return self.n + self.nan
