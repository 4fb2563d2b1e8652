"""A run's cost section: the SLO held or not, steady cost per 1k at it, cold start, and the
autoscaled replay of its arrivals."""

from __future__ import annotations

from typing import Any

import numpy as np

from netgain.analysis import cost


def slo_held(
    slo: float | None, p99: float | None, max_err: float | None, error_rate: float | None, warnings: list[str]
) -> bool | None:
    """The SLO: p99 at or under it and, when configured, the error rate at or under its maximum."""
    held = None if slo is None or p99 is None else bool(p99 <= slo)
    if held and max_err is not None and error_rate is not None and error_rate > max_err:
        held = False
        warnings.append(f"error rate {error_rate:.4f} > max_error_rate {max_err}")
    return held


def missed(p99: float | None, slo: float) -> str:
    """How the run missed the SLO: its p99 above it, or no p99 at all (no success to measure)."""
    if p99 is None:
        return f"no measured request succeeded: no p99 to hold the SLO {slo:g} ms"
    return f"p99 {p99:.1f} ms misses the SLO {slo:g} ms"


def section(
    meta: dict[str, Any],
    rate: np.ndarray,
    *,
    price: float | None,
    slo: float | None,
    slo_held: bool | None,
    p99: float | None,
    thr: float,
    valid: bool,
    capacity_rps: float | None,
    min_replicas: int,
    scale_down_after_s: float,
) -> dict[str, Any]:
    """Steady cost per 1k at the SLO (or why not), cold start, and the autoscaled replay of the arrivals."""
    steady = cost.cost_per_1k(price, thr)
    note = None
    if price is None:
        note = "no price: pass --price-per-hour (or set config.price_per_hour)"
    elif slo is None:
        note = "no SLO given: cost is at the measured throughput, latency objective unchecked"
    elif not slo_held:
        note = f"{missed(p99, slo)}: no cost at SLO for this run"
        steady = None
    cold = cost.cold_start_s(meta)
    # Capacity comes only from a run that held the SLO: past it, completions measure an overloaded
    # server, not what one replica carries at the objective.
    own = thr > 0 and valid and slo_held is not False
    cap = capacity_rps if capacity_rps else (thr if own else None)
    auto = None
    capacity_note = None
    if not cap:
        capacity_note = (
            "capacity at the SLO unknown: "
            + (
                "this run is INVALID"
                if not valid
                else f"this run missed the SLO (p99 {p99:.1f} ms > {slo:g} ms)"
            )
            + "; pass --sweep (runs at lower rates) or --capacity-rps"
            if thr > 0
            else "capacity unknown: no request completed inside the window"
        )
    if cap:
        auto = cost.autoscale(
            rate,
            capacity_rps=cap,
            cold_start_s=cold or 0.0,
            price_per_hour=price,
            min_replicas=min_replicas,
            scale_down_after_s=scale_down_after_s,
        )
        auto["capacity_source"] = (
            "given (rate sweep or --capacity-rps)"
            if capacity_rps
            else (
                "this run's completions in the window (a lower bound on capacity at the SLO)"
                if slo_held
                else "this run's completions in the window (no SLO given: a lower bound on capacity)"
            )
        )
    return {
        "cold_start_s": cold,
        "cost_per_1k": steady,
        "cost": {
            "price_per_hour": price,
            "slo_p99_ms": slo,
            "slo_held": slo_held,
            "note": note,
            "cost_per_1k_measured": cost.cost_per_1k(price, thr),
            "capacity_note": capacity_note,
            "autoscale": auto,
        },
    }
