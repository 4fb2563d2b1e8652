"""Cost per 1,000 successful inferences: steady state, and under an autoscaler replaying the traffic.

Steady: ``price_per_hour / throughput_rps * 1000 / 3600``. The throughput is end to end
(client-observed successes), so CPU pre/post and host-device copies are inside it by
construction. The autoscaling model prices what a real deployment pays on top: instances that
sit idle at minimum scale, and the cold start of every scale-up during which the traffic
above capacity misses the SLO.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def cost_per_1k(price_per_hour: float | None, throughput_rps: float | None) -> float | None:
    if price_per_hour is None or not throughput_rps or throughput_rps <= 0:
        return None
    return price_per_hour / throughput_rps * 1000.0 / 3600.0


def cold_start_s(meta: dict[str, Any]) -> float | None:
    """Process creation to ready: the last phase's end (``at_s`` is the end of each phase)."""
    phases = (meta.get("server") or {}).get("cold_start") or []
    ends = [float(p["at_s"]) for p in phases if isinstance(p, dict) and p.get("at_s") is not None]
    if ends:
        return max(ends)
    durs = [float(p["duration_s"]) for p in phases if isinstance(p, dict) and p.get("duration_s") is not None]
    return sum(durs) if durs else None


def arrival_rate(scheduled_s: np.ndarray, bin_s: float = 1.0, end_s: float | None = None) -> np.ndarray:
    """Scheduled arrivals per second in consecutive bins from t = 0 (the whole recorded trace)."""
    if len(scheduled_s) == 0:
        return np.zeros(0)
    # bins cover [0, end_s) and every scheduled arrival; a trace of 10 s at 1 s bins has 10 bins
    nbins = max(1, math.ceil((end_s or 0.0) / bin_s - 1e-9), int(float(scheduled_s.max()) // bin_s) + 1)
    idx = np.clip((scheduled_s / bin_s).astype(np.int64), 0, nbins - 1)
    return np.bincount(idx, minlength=nbins).astype(np.float64) / bin_s


def autoscale(
    rate_rps: np.ndarray,
    *,
    capacity_rps: float,
    cold_start_s: float,
    price_per_hour: float | None,
    min_replicas: int = 1,
    scale_down_after_s: float = 60.0,
    bin_s: float = 1.0,
) -> dict[str, Any]:
    """Replay per-bin arrival rates through a reactive autoscaler.

    Each bin: wanted = max(min_replicas, ceil(rate / capacity)). Missing replicas start at
    once and serve only after ``cold_start_s`` (billed while starting). Replicas above
    ``wanted`` stop only after ``wanted`` has stayed lower for ``scale_down_after_s``. Traffic
    above the ready capacity is counted as requests and seconds in SLO violation.
    """
    if capacity_rps <= 0:
        raise ValueError("capacity_rps must be > 0")
    delay_bins = math.ceil(max(0.0, cold_start_s) / bin_s - 1e-9)
    hold_bins = max(0, math.ceil(scale_down_after_s / bin_s - 1e-9))
    n = len(rate_rps)
    ready = min_replicas
    starting: list[int] = []  # bin at which each starting replica becomes ready
    replicas = np.zeros(n, dtype=np.int64)  # billed: ready + starting
    ready_series = np.zeros(n, dtype=np.int64)
    over_rps = np.zeros(n)
    wanted_hist: list[int] = []
    for i in range(n):  # one step per second of trace: thousands, not millions
        ready += sum(1 for b in starting if b <= i)
        starting = [b for b in starting if b > i]
        wanted = max(min_replicas, math.ceil(rate_rps[i] / capacity_rps - 1e-9))
        wanted_hist.append(wanted)
        if wanted > ready + len(starting):
            starting += [i + delay_bins] * (wanted - ready - len(starting))
            if delay_bins == 0:
                ready += len(starting)
                starting = []
        recent = max(wanted_hist[-hold_bins - 1 :]) if hold_bins else wanted
        if ready > recent and not starting:
            ready = recent
        replicas[i] = ready + len(starting)
        ready_series[i] = ready
        over_rps[i] = max(0.0, rate_rps[i] - ready * capacity_rps)
    requests = float(rate_rps.sum() * bin_s)
    instance_s = float(replicas.sum() * bin_s)
    busy_s = float((rate_rps / capacity_rps).sum() * bin_s)
    out: dict[str, Any] = {
        "capacity_rps": capacity_rps,
        "cold_start_s": cold_start_s,
        "min_replicas": min_replicas,
        "scale_down_after_s": scale_down_after_s,
        "bin_s": bin_s,
        "duration_s": n * bin_s,
        "requests": requests,
        "instance_seconds": instance_s,
        "busy_instance_seconds": busy_s,
        "idle_instance_seconds": max(0.0, instance_s - busy_s),
        "max_replicas": int(replicas.max(initial=0)),
        "slo_violation_s": float((over_rps > 0).sum() * bin_s),
        "requests_over_capacity": float(over_rps.sum() * bin_s),
        "cost": None,
        "idle_cost": None,
        "cost_per_1k": None,
        "replicas": replicas.tolist(),
        "ready": ready_series.tolist(),
        "rate_rps": rate_rps.tolist(),
    }
    if price_per_hour is not None and requests > 0:
        out["cost"] = instance_s / 3600.0 * price_per_hour
        out["idle_cost"] = out["idle_instance_seconds"] / 3600.0 * price_per_hour
        out["cost_per_1k"] = out["cost"] / requests * 1000.0
    return out


def capacity_from_points(
    points: list[dict[str, Any]], slo_p99_ms: float | None, max_error_rate: float | None = None
) -> dict[str, Any]:
    """Highest successful throughput among valid runs whose p99 met the SLO (a rate sweep).

    ``points``: one dict per run with ``throughput_rps``, ``p99_ms``, ``error_rate``, ``valid``.
    Without an SLO every valid run qualifies (the capacity is then the best throughput seen).
    """
    ok = [
        p
        for p in points
        if p.get("valid")
        and p.get("throughput_rps")
        and (slo_p99_ms is None or (p.get("p99_ms") is not None and p["p99_ms"] <= slo_p99_ms))
        and (max_error_rate is None or (p.get("error_rate") or 0.0) <= max_error_rate)
    ]
    best = max(ok, key=lambda p: p["throughput_rps"]) if ok else None
    return {
        "capacity_rps": best["throughput_rps"] if best else None,
        "from_run": best.get("run_dir") if best else None,
        "slo_p99_ms": slo_p99_ms,
        "runs": len(points),
        "runs_meeting_slo": len(ok),
    }
