"""compare's pricing of searched capacities: both brackets, a trace's fleets, the bracket in words,
and the NEXT lines (what limited each side)."""

from __future__ import annotations

import json
import os
from typing import Any

from netgain.contract.report import Report
from netgain.experiments import capacity


def describe(cap: capacity.Capacity) -> str:
    """A capacity with its bracket, in words."""
    if cap.reached_floor:
        return f"held the SLO at no rate down to the floor, {cap.floor_rps:g} req/s ({cap.runs} runs)"
    if cap.capacity_rps is None:
        return f"capacity unknown ({cap.runs} runs)"
    top = (
        f"held up to the ceiling, {cap.ceiling_rps:g} req/s"
        if cap.unbounded
        else f"first missed {cap.first_missed:.4g} req/s"
    )
    return (
        f"capacity {cap.capacity_rps:.4g} req/s at the SLO (last held {cap.last_held:.4g} req/s, "
        f"{top}; {cap.runs} runs)"
    )


def searched(sides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Both sides' capacity brackets when both were found by the search, else None (a fixed sweep)."""
    if not all("capacity" in sides[n] for n in ("baseline", "treatment")):
        return None
    return {n: dict(sides[n]["capacity"]) for n in ("baseline", "treatment")}


def price_trace(cfg: Any, sides: dict[str, dict[str, Any]], rep: Report) -> dict[str, Any]:
    """The trace priced per side at its searched capacity: a fleet sized for the trace's peak, and one
    following its per-second rate, each scale-up paying the cold start its cold run measured."""
    from netgain.analysis.pricing import fleets

    rates = next(
        (
            a["rate_rps"]
            for r in (rep, *([rep["baseline"]] if "baseline" in rep else []))
            if (a := r["cost"]["autoscale"] or {}).get("rate_rps")
        ),
        None,
    )
    out: dict[str, Any] = {"bin_s": 1.0}
    for name in ("baseline", "treatment"):
        side = cfg.baseline if name == "baseline" else cfg.treatment
        cap = sides[name]["capacity"].get("capacity_rps")
        cold = _cold_start_s(sides[name]["batches"][sides[name]["best_batch"]]["cold"])
        if rates is None or not cap:
            out[name] = None
            continue
        out[name] = fleets(
            rates, bin_s=1.0, capacity_rps=cap, price_per_hour=side.price_per_hour, cold_start_s=cold or 0.0
        )
    return out


def _cold_start_s(cold_run: str) -> float | None:
    """Spawn to serving of the cold run's server (its drill.json), or None."""
    try:
        with open(os.path.join(cold_run, "drill.json")) as fh:
            return float(json.load(fh)["spawn_to_serving_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def limit_lines(limits: list[dict[str, Any]]) -> list[str]:
    """``NEXT`` lines: each side's limiting resource in the sweep and the change it calls for."""
    lines = []
    for lim in limits:
        where = (
            f"held the SLO at every rate tried; at the highest, {lim['rate']:g} req/s"
            if lim["held_every_rate"]
            else f"first missed at {lim['rate']:g} req/s" + (f" ({lim['why']})" if lim.get("why") else "")
        )
        for k in lim["kinds"]:
            lines.append(f"NEXT {lim['side']} ({lim['device']}): {where}, {k['kind']}: {k['action']}")
    return lines
