"""compare's pricing of searched capacities: both brackets, a trace's fleets, the bracket in words,
and the NEXT lines (what limited each side)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from netgain.contract.report import Report
from netgain.experiments import capacity
from netgain.experiments.steps import done as _done
from netgain.experiments.steps import judge

if TYPE_CHECKING:
    from netgain.experiments.cpu_vs_gpu import CompareConfig


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


def step_trial(cfg: CompareConfig, run_dir: str, rate: float) -> capacity.Trial:
    """A finished run's figures and whether it held (valid, p99 within the SLO, errors under the bound)."""
    return judge(run_dir, rate, cfg.slo_p99_ms, cfg.max_error_ratio)


def miss_reason(t: capacity.Trial, slo_p99_ms: float, max_error_ratio: float) -> str:
    """Which of the search's rules a step broke, with its figures: a step can miss on errors alone."""
    parts = []
    if not t.valid:
        parts.append("the run was invalid")
    if t.p99 > slo_p99_ms:
        parts.append(f"p99 {t.p99:.1f} ms over {slo_p99_ms:g}")
    if t.error_ratio > max_error_ratio:
        parts.append(f"{t.error_ratio:.2%} of requests failed, over the {max_error_ratio:.2%} bound")
    if parts and t.p99 <= slo_p99_ms:
        parts.append(f"p99 {t.p99:.1f} ms held")
    return "; ".join(parts)


def limits_of(cfg: CompareConfig, sides: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per side, what limited it in the rate sweep: the bottleneck of the first rate past the SLO
    (where the limiting resource shows), or of the highest rate when every rate held."""
    out: list[dict[str, Any]] = []
    for name in ("baseline", "treatment"):
        side = cfg.baseline if name == "baseline" else cfg.treatment
        rates = sides[name].get("sweep_rates", cfg.rates)
        runs = sorted((r, d) for r, d in zip(rates, sides[name]["sweep"], strict=True) if _done(d))
        if not runs:
            continue
        trials = {r: step_trial(cfg, d, r) for r, d in runs}  # the search's own rule: errors count
        held = [r for r, _ in runs if trials[r].held]
        missed = [(r, d) for r, d in runs if r not in held]
        rate, run_dir = missed[0] if missed else runs[-1]
        out.append(
            {
                "side": name,
                "device": side.device,
                "rate": rate,
                "run": run_dir,
                "held_every_rate": not missed,
                "held_rates": held,
                "why": miss_reason(trials[rate], cfg.slo_p99_ms, cfg.max_error_ratio) if missed else "",
                "kinds": [{"kind": k, "action": a} for k, a in trials[rate].levers],
            }
        )
    return out
