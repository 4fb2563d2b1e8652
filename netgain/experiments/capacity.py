"""Capacity at the SLO by search: the one search that ``tune`` and ``compare`` both run.

A side's capacity at the SLO is the highest completed rate of a run that held: valid, p99 within
the objective, errors under the bound (``Trial.held``, decided by the caller's ``run``). The search
starts at ``start`` (clamped to [floor, ceiling]); if that run misses it halves down to the floor
until one holds, if it holds it doubles up to the ceiling until one misses; then it bisects
between the last rate that held and the first that missed until
``(first_missed - last_held) / last_held <= precision``. The result is a bracket, never a point
alone: ``last_held`` and ``first_missed`` (offered rates), and ``capacity_rps``, the best completed
throughput among the runs that held when it lies in the bracket, else the last held rate.
Nothing held down to the floor: ``reached_floor`` (the side cannot meet the SLO at any rate >=
floor). Everything held up to the ceiling: ``unbounded``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Trial:
    rate: float
    throughput: float
    p50: float
    p99: float
    errors: int
    error_ratio: float
    valid: bool
    bottleneck: str
    held: bool
    # the report's (kind, action) pairs, so a caller naming the limit need not build it again
    levers: tuple[tuple[str, str], ...] = ()
    samples: int = 0  # successful requests in the measured window: p99's sample


@dataclass
class Capacity:
    """The bracket a search ended with (rates in req/s)."""

    capacity_rps: float | None  # best completed throughput among the runs that held
    last_held: float | None  # highest offered rate that held
    first_missed: float | None  # lowest offered rate above it that missed
    floor_rps: float
    ceiling_rps: float
    precision: float
    runs: int
    reached_floor: bool = False  # nothing held, down to the floor
    unbounded: bool = False  # everything held, up to the ceiling
    held_samples: int = 0  # successful requests of the last held run's window (0: not known)

    @property
    def known(self) -> bool:
        """A capacity with both ends of its bracket (or proven absent down to the floor)."""
        return self.reached_floor or (self.last_held is not None and self.first_missed is not None)

    @property
    def upper_rps(self) -> float | None:
        """The most the capacity can be: the first missed rate (None when unbounded or unknown)."""
        return self.first_missed

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "known": self.known}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capacity:
        """The inverse of to_dict (a report's ``compare.capacity``): unknown keys ignored, missing
        ones (an older report's) taken as unmeasured."""
        base: dict[str, Any] = dict.fromkeys(("capacity_rps", "last_held", "first_missed"))
        base.update(floor_rps=0.0, ceiling_rps=0.0, precision=0.0, runs=0)
        names = cls.__dataclass_fields__
        return cls(**{**base, **{k: v for k, v in d.items() if k in names and v is not None}})

    def words(self) -> str:
        """The capacity with its bracket, in words (compare's progress and its CAPACITY lines)."""
        if self.reached_floor:
            return f"meets the SLO at no rate down to {self.floor_rps:g} req/s ({self.runs} runs)"
        if self.capacity_rps is None or self.last_held is None:
            return f"unknown ({self.runs} runs)"
        if self.unbounded:
            top = f"held up to the ceiling, {self.ceiling_rps:g} req/s"
        elif self.first_missed is None:  # runs recorded elsewhere that all held: nothing above measured
            top = "no higher rate measured"
        else:
            top = f"first missed {self.first_missed:.4g} req/s"
        return (
            f"{self.capacity_rps:.4g} req/s at the SLO (last held {self.last_held:.4g} req/s, "
            f"{top}; {self.runs} runs{thin_words(self.held_samples or 0)})"
        )


# The fewest successful requests that bound a p99 at 95 % confidence (the reports' enough_samples).
P99_SAMPLES = math.ceil(math.log(0.05) / math.log(0.99))
# Poisson arrivals send fewer than their mean half the time: aim three standard deviations above.
STEP_REQUESTS = P99_SAMPLES + 3 * math.ceil(math.sqrt(P99_SAMPLES))
MAX_STEP_STRETCH = 2.0  # a low-rate step runs at most this many times the set step length


def thin(samples: int) -> bool:
    """A p99 of ``samples`` successful requests (0: not known) rests on fewer than bound one: it is
    near their maximum."""
    return 0 < samples < P99_SAMPLES


def thin_words(held_samples: int) -> str:
    """What a bracket's caller appends when its last held run's p99 rests on too few requests."""
    if not thin(held_samples):
        return ""
    return (
        f"; the last held run's p99 rests on {held_samples} successful requests (a p99 needs "
        f"{P99_SAMPLES}: longer --sweep-duration steps bound it)"
    )


def step_seconds(step_s: float, rate: float) -> float:
    """A step's measured seconds at ``rate``: long enough to send STEP_REQUESTS, at most
    MAX_STEP_STRETCH x ``step_s`` (a side that holds only low rates must not stall the search)."""
    if not rate > 0 or not step_s > 0:
        return step_s
    return min(max(step_s, STEP_REQUESTS / rate), MAX_STEP_STRETCH * step_s)


MAX_START_LEAP = 32.0  # the farthest a search's first rate extrapolates from the run it came from


def start_from(rate: float, pressure: float | None) -> float | None:
    """A search's first rate from a run that held at ``rate`` with its nearest resource at ``pressure``
    of that resource's saturation threshold: half the rate where it would reach the threshold if its
    use grew in proportion (at low load it often grows less than that), at most
    MAX_START_LEAP x ``rate``, to three significant figures. None without a pressure, or when
    that is not above ``rate`` (no room to read)."""
    if pressure is None or not pressure > 0 or not rate > 0 or rate / pressure / 2 <= rate:
        return None
    return float(f"{min(rate / pressure / 2, MAX_START_LEAP * rate):.3g}")


@dataclass
class SearchResult:
    trials: list[Trial]
    capacity: Capacity


def expected_runs(start: float, floor: float, ceiling: float, precision: float) -> tuple[int, int]:
    """(typical, most) runs of one search: a few doublings plus the bisection, and the worst case
    (all the way to the floor or the ceiling, then the bisection)."""
    bisect = max(0, math.ceil(math.log2(1.0 / precision))) if precision > 0 else 0
    up = max(0, math.ceil(math.log2(ceiling / start))) if start > 0 else 0
    down = max(0, math.ceil(math.log2(start / floor))) if floor > 0 else 0
    return 1 + min(3, up + down) + bisect, 1 + max(up, down) + bisect


def point(held: list[float], last_held: float | None, first_missed: float | None) -> float | None:
    """The capacity point: the best throughput completed by a run that held, when it lies in the
    bracket [last held, first missed); else the last held rate. A short window's arrivals can run
    above their mean (Poisson) or fall mostly outside it (a bursty trace's first requests)."""
    best = max(held, default=None)
    if best is None or last_held is None:
        return best
    if best < last_held or (first_missed is not None and best >= first_missed):
        return last_held
    return best


def search(
    run: Callable[[float], Trial],
    start: float,
    *,
    floor: float,
    ceiling: float,
    precision: float = 0.1,
    max_bisect: int | None = None,
) -> SearchResult:
    """Search the capacity at the SLO with ``run(rate) -> Trial``; the trials in order and the bracket.

    ``max_bisect`` caps the bisection runs (None: until ``precision``).
    """
    if not 0 < floor <= ceiling:
        raise ValueError(f"need 0 < floor <= ceiling, got floor {floor:g}, ceiling {ceiling:g}")
    if precision <= 0:
        raise ValueError(f"precision must be > 0, got {precision:g}")
    trials: list[Trial] = []

    def step(rate: float) -> bool:
        t = run(rate)
        trials.append(t)
        return t.held

    good: float | None = None
    bad: float | None = None
    rate = min(max(start, floor), ceiling)
    if step(rate):
        good = rate
        while rate < ceiling:
            rate = min(rate * 2, ceiling)
            if not step(rate):
                bad = rate
                break
            good = rate
    else:
        bad = rate
        while rate > floor:
            rate = max(rate / 2, floor)
            if step(rate):
                good = rate
                break
            bad = rate
    bisected = 0
    while (
        good is not None
        and bad is not None
        and (bad - good) / good > precision
        and (max_bisect is None or bisected < max_bisect)
    ):
        mid = (good + bad) / 2
        bisected += 1
        if step(mid):
            good = mid
        else:
            bad = mid
    cap = Capacity(
        capacity_rps=point([t.throughput for t in trials if t.held], good, bad),
        last_held=good,
        first_missed=bad,
        floor_rps=floor,
        ceiling_rps=ceiling,
        precision=precision,
        runs=len(trials),
        reached_floor=good is None,
        unbounded=bad is None,
        held_samples=_samples_at(trials, good),
    )
    return SearchResult(trials, cap)


def _samples_at(trials: list[Trial], rate: float | None) -> int:
    """The successful requests of the last run that held at ``rate`` (0 when none did)."""
    return next((t.samples for t in reversed(trials) if t.held and t.rate == rate), 0)


def from_trials(trials: list[Trial], *, floor: float, ceiling: float, precision: float) -> Capacity:
    """The bracket of runs made earlier (recorded elsewhere, or a fixed sweep): the highest rate that
    held and the lowest above it that missed."""
    held = [t for t in trials if t.held]
    good = max((t.rate for t in held), default=None)
    above = [t.rate for t in trials if not t.held and (good is None or t.rate > good)]
    bad = min(above, default=None)
    lowest = min((t.rate for t in trials), default=None)
    return Capacity(
        capacity_rps=point([t.throughput for t in held], good, bad),
        last_held=good,
        first_missed=bad,
        floor_rps=floor,
        ceiling_rps=ceiling,
        precision=precision,
        runs=len(trials),
        reached_floor=good is None and lowest is not None and lowest <= floor * (1 + 1e-9),
        unbounded=bad is None and good is not None and good >= ceiling * (1 - 1e-9),
        held_samples=_samples_at(trials, good),
    )
