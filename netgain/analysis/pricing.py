"""Pricing at measured capacity: where two sides' cost curves cross, and what a trace costs.

A side of per-replica capacity ``c`` at the SLO and price ``p`` per hour carries a steady rate ``r``
with ``n(r) = ceil(r / c)`` replicas, so its cost per 1,000 successful inferences is
``n(r) * p / (r * 3.6)``. Both sides' costs share the ``1 / (r * 3.6)``, so the treatment is cheaper
at ``r`` exactly when ``n_t(r) * p_t < n_b(r) * p_b``: a comparison of two step functions that
changes only at multiples of either capacity. The crossover is computed on those steps (no
sampling): the lowest rate from which the treatment is cheaper at every higher rate.

A capacity known as a bracket (a lower and an upper bound) gives the crossover an interval: the
crossover is computed at the four corners of the two brackets and the interval spans them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# A scan that would need more steps than this is cut off: the sides' costs per capacity are then
# within a hair of each other and the crossover is where the asymptote says (``approximate``).
MAX_STEPS = 50_000


def replicas(rate_rps: float, capacity_rps: float) -> int:
    """Replicas of ``capacity_rps`` each that carry ``rate_rps`` (at least one; an unbounded capacity
    carries any rate with one)."""
    if math.isinf(capacity_rps):
        return 1
    return max(1, math.ceil(rate_rps / capacity_rps - 1e-9))


@dataclass(frozen=True)
class Crossing:
    """Where the treatment becomes the cheaper side for good.

    ``from_rps``: the treatment is cheaper at every rate above it (0.0: at every rate; None: at
    no rate for good, its cost per capacity being the higher). ``first_rps``: the lowest rate at
    which it is cheaper at all (None: at none). ``approximate``: the scan was cut at MAX_STEPS.
    """

    from_rps: float | None
    first_rps: float | None
    approximate: bool = False


def _cheaper(r: float, cb: float, pb: float, ct: float, pt: float) -> bool:
    return replicas(r, ct) * pt < replicas(r, cb) * pb


def crossing(cb: float, pb: float, ct: float, pt: float) -> Crossing:
    """The crossover of baseline (capacity ``cb``, price ``pb``) and treatment (``ct``, ``pt``).

    Capacities may be ``math.inf`` (held at every rate up to the ceiling: one replica carries all).
    """
    if not (cb > 0 and ct > 0 and pb > 0 and pt > 0):
        raise ValueError("capacities and prices must be > 0")
    if math.isinf(cb) and math.isinf(ct):  # one replica each at every rate
        return Crossing(0.0, 0.0) if pt < pb else Crossing(None, None)
    per_b, per_t = pb / cb, pt / ct  # cost per unit of capacity: the slope far out
    # Past `bound` the comparison no longer changes: n * p is within one replica's price of r * p / c.
    bound = pt / (per_b - per_t) if per_t < per_b else pb / (per_t - per_b) if per_t > per_b else math.inf
    first: float | None = None
    last_not: float | None = None
    # Walk the intervals (x, y] between consecutive multiples of either capacity: on each, both
    # replica counts are constant, so one comparison (at y) decides the whole interval.
    x, kb, kt, steps, approximate = 0.0, 1, 1, 0, False
    while x <= bound * (1 + 1e-9):
        nb, nt = kb * cb, kt * ct  # inf stays inf
        y = min(nb, nt)
        steps += 1
        if steps > MAX_STEPS:
            approximate = True
            break
        if _cheaper(y, cb, pb, ct, pt):
            first = x if first is None else first
        else:
            last_not = y
        kb += nb <= nt
        kt += nt <= nb
        x = y
    if per_t >= per_b:  # far out the treatment costs as much or more: it does not win for good
        return Crossing(None, first, approximate)
    start = bound if approximate else (last_not if last_not is not None else 0.0)
    return Crossing(start, start if first is None else first, approximate)


def crossing_interval(
    baseline: tuple[float, float], pb: float, treatment: tuple[float, float], pt: float
) -> tuple[Crossing, Crossing, list[float | None]]:
    """Crossings at the bracket corners that bound it: the baseline at its highest capacity and the
    treatment at its lowest (the crossover as late as the brackets allow), and the reverse (as early
    as they allow); with [low, high] of ``from_rps`` over all four corners (None ends: no crossover
    at that corner)."""
    (b_lo, b_hi), (t_lo, t_hi) = baseline, treatment
    corners = [crossing(b, pb, t, pt) for b in (b_lo, b_hi) for t in (t_lo, t_hi)]
    late, early = crossing(b_hi, pb, t_lo, pt), crossing(b_lo, pb, t_hi, pt)
    vals = [c.from_rps for c in corners]
    known = [v for v in vals if v is not None]
    lo = min(known) if known else None
    hi = max(known) if known and len(known) == len(vals) else None
    return late, early, [lo, hi]


def fleets(
    rate_rps: list[float] | Any,
    *,
    bin_s: float,
    capacity_rps: float,
    price_per_hour: float,
    cold_start_s: float,
) -> dict[str, Any]:
    """A trace's cost per 1k on a fleet sized for its peak and on one that follows it.

    ``rate_rps``: the trace's arrival rate per window of ``bin_s`` seconds. Peak-sized: ``ceil(peak /
    capacity)`` replicas for the whole trace. Following: ``ceil(rate_w / capacity)`` replicas (at
    least one) in each window; every replica added is billed ``cold_start_s`` more (it starts before
    it serves), and the requests above the ready capacity during those seconds are counted as at
    risk of missing the SLO.
    """
    rates = [max(0.0, float(r)) for r in rate_rps]
    if not rates or capacity_rps <= 0 or bin_s <= 0:
        raise ValueError("need a non-empty trace, a capacity > 0 and a window > 0")
    requests = sum(rates) * bin_s
    duration = len(rates) * bin_s
    peak = max(rates)
    n_peak = replicas(peak, capacity_rps)
    per_w = [replicas(r, capacity_rps) for r in rates]
    ups, at_risk, prev = 0, 0.0, per_w[0]
    for r, n in zip(rates[1:], per_w[1:], strict=True):
        if n > prev:
            ups += n - prev
            at_risk += max(0.0, r - prev * capacity_rps) * min(cold_start_s, bin_s)
        prev = n
    follow_s = sum(per_w) * bin_s + ups * cold_start_s
    peak_s = n_peak * duration

    def per_1k(instance_s: float) -> float | None:
        return instance_s / 3600.0 * price_per_hour / requests * 1000.0 if requests > 0 else None

    return {
        "capacity_rps": capacity_rps,
        "price_per_hour": price_per_hour,
        "bin_s": bin_s,
        "duration_s": duration,
        "requests": requests,
        "peak_rps": peak,
        "peak": {
            "replicas": n_peak,
            "instance_seconds": peak_s,
            "cost": peak_s / 3600.0 * price_per_hour,
            "cost_per_1k": per_1k(peak_s),
        },
        "autoscaled": {
            "max_replicas": max(per_w),
            "scale_ups": ups,
            "cold_start_s": cold_start_s,
            "instance_seconds": follow_s,
            "cost": follow_s / 3600.0 * price_per_hour,
            "cost_per_1k": per_1k(follow_s),
            "requests_at_risk": at_risk,
        },
    }
