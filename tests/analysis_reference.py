"""Reference computations for test_analysis_keys: what report.json must say, computed
independently with numpy on the raw Parquet rows of the synthetic runs, and the scenario
constants those runs are built from."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from analysis_fixtures import PHASES

RATE, DURATION, WARMUP = 200.0, 6.0, 1.0
SLO, PRICE_T, PRICE_B, BOOT = 50.0, 3.0, 1.0, 40
COLD_START = [
    {"name": "process_start", "at_s": 0.5, "duration_s": 0.5},
    {"name": "imports", "at_s": 1.5, "duration_s": 1.0},
    {"name": "ready", "at_s": 4.0, "duration_s": 2.5},
]


# -- independent computations on the raw rows ------------------------------------------------


def raw_rows(run: Path) -> dict[str, np.ndarray]:
    t = pq.read_table(run / "requests.parquet").to_pydict()
    out: dict[str, np.ndarray] = {}
    for k, vals in t.items():
        if k.endswith(("_ns", "_ms")) or k == "batch_size":
            out[k] = np.array([np.nan if v is None else v for v in vals], dtype=float)
        else:
            out[k] = np.array(vals)
    return out


def _pct(x: np.ndarray, q: float) -> float:
    """Nearest rank in exact arithmetic: the ceil(q * n)-th smallest (q = 0.999, n = 1000 -> the 999th)."""
    k = math.ceil(Fraction(str(q)) * len(x))
    return float(np.sort(x)[max(k, 1) - 1])


def _summary(x: np.ndarray) -> dict[str, float]:
    out = {
        k: _pct(x, q) for k, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))
    }
    out["max"] = float(x.max())
    return out


def _phase(x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    return {
        "mean": float(x.mean()),
        "p50": _pct(x, 0.5),
        "p90": _pct(x, 0.9),
        "p99": _pct(x, 0.99),
        "max": float(x.max()),
        "n": len(x),
    }


def binomial_bound(n: int, q: float) -> int | None:
    """Smallest k with P(S >= k) <= 0.05 for S ~ Binomial(n, q), by summing pmf terms from the top."""
    sf, best = 0.0, None
    for k in range(n, 0, -1):
        sf += math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(q)
            + (n - k) * math.log1p(-q)
        )
        if sf > 0.05:
            break
        best = k
    return best


def _enough(lat_sorted: np.ndarray, q: float, min_samples: int) -> dict[str, Any]:
    n = len(lat_sorted)
    out: dict[str, Any] = {
        "quantile": q,
        "n": n,
        "confidence": 0.95,
        "samples_above": int((lat_sorted > _pct(lat_sorted, q)).sum()),
        "enough": False,
        "upper_bound_ms": None,
        "min_samples": min_samples,
    }
    k = binomial_bound(n, q)
    if k is not None:
        out.update(enough=True, upper_bound_ms=float(lat_sorted[k - 1]), upper_bound_rank=k)
    return out


def _tail(
    lat: np.ndarray, cols: dict[str, np.ndarray], bs: np.ndarray, thr: float, band_ms: list[float]
) -> dict:
    names = (*PHASES, "network", "send_lag", "other")
    band = (lat >= band_ms[0]) & (lat <= band_ms[1])

    def means(sel: np.ndarray) -> dict[str, float]:
        return {p: float(np.nanmean(cols[p][sel])) for p in names}

    def one(sel: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
        tm, mm = means(sel), means(ref)
        excess = {p: tm[p] - mm[p] for p in names}
        return {
            "n": int(sel.sum()),
            "tm": tm,
            "mm": mm,
            "excess": excess,
            "dominant": max(names, key=excess.get),
        }

    sel = lat >= thr
    r = one(sel, band)
    tail_lat = float(lat[sel].mean())
    by_batch = {}
    for s in sorted(set(bs[sel].tolist())):
        of = bs == s
        b = one(sel & of, band & of if (band & of).any() else band)
        by_batch[str(int(s))] = {"n": b["n"], "dominant": b["dominant"], "excess_ms": b["excess"]}
    return {
        "n": r["n"],
        "latency_mean_ms": tail_lat,
        "median_latency_mean_ms": float(lat[band].mean()),
        "dominant": r["dominant"],
        "phases": {
            p: {
                "tail_mean_ms": r["tm"][p],
                "median_mean_ms": r["mm"][p],
                "excess_ms": r["excess"][p],
                "share": r["tm"][p] / tail_lat,
            }
            for p in names
        },
        "threshold_ms": thr,
        "by_batch_size": by_batch,
    }


def autoscale(
    price: float, capacity: float, replicas: list[int], ready: list[int], rates: list[float]
) -> dict[str, Any]:
    """The replay's totals from its per-second series (the series themselves are hand-computed)."""
    requests = sum(rates)
    inst = float(sum(replicas))
    busy = sum(r / capacity for r in rates)
    over = [max(0.0, r - k * capacity) for r, k in zip(rates, ready, strict=True)]
    cost = inst / 3600 * price
    return {
        "capacity_rps": capacity,
        "cold_start_s": 4.0,
        "min_replicas": 1,
        "scale_down_after_s": 60.0,
        "bin_s": 1.0,
        "duration_s": float(len(rates)),
        "requests": requests,
        "instance_seconds": inst,
        "busy_instance_seconds": busy,
        "idle_instance_seconds": inst - busy,
        "max_replicas": max(replicas),
        "slo_violation_s": float(sum(o > 0 for o in over)),
        "requests_over_capacity": sum(over),
        "cost": cost,
        "idle_cost": (inst - busy) / 3600 * price,
        "cost_per_1k": cost / requests * 1000,
        "replicas": replicas,
        "ready": ready,
        "rate_rps": rates,
        "capacity_source": "given (rate sweep or --capacity-rps)",
    }


def completed(raw: dict[str, Any], t0: float, t1: float) -> int:
    """OK requests that finished inside [t0, t1) s, whenever they were scheduled."""
    done_s = raw["done_ns"] / 1e9
    return int(((raw["status"] == "OK") & (done_s >= t0) & (done_s < t1)).sum())


def section(run: Path, *, price: float, auto: dict[str, Any], device: str, errors: dict[str, int]) -> dict:
    """The expected report section of one run (everything except gpu/cpu/queue/bottleneck/join)."""
    raw = raw_rows(run)
    measured = ~raw["warmup"].astype(bool)
    ok = measured & (raw["status"] == "OK")
    sched, sent, done = raw["scheduled_ns"], raw["sent_ns"], raw["done_ns"]
    lat = (done - sched)[ok] / 1e6
    lat_sorted = np.sort(lat)
    service = (done - sent)[ok] / 1e6
    lag_all = (sent - sched) / 1e6
    n_ok, n_measured = int(ok.sum()), int(measured.sum())
    window = DURATION - WARMUP
    n_done = completed(raw, WARMUP, DURATION)
    thr = n_done / window
    cols = {p: raw[f"{p}_ms"][ok] for p in PHASES}
    total = raw["server_total_ms"][ok]
    cols["network"] = service - total
    cols["send_lag"] = lag_all[ok]
    cols["other"] = total - sum(cols[p] for p in PHASES)
    latency = _summary(lat)
    latency["mean"] = float(lat.mean())
    # median band: the nearest-rank p45 and p55 latencies
    band_ms = [_pct(lat, 0.45), _pct(lat, 0.55)]
    tail99 = _tail(lat, cols, raw["batch_size"][ok], latency["p99"], band_ms)
    tail999 = _tail(lat, cols, raw["batch_size"][ok], latency["p999"], band_ms)
    t_ok = sched[ok] / 1e9
    mid = (t_ok.min() + t_ok.max()) / 2
    first, second = _pct(lat[t_ok < mid], 0.5), _pct(lat[t_ok >= mid], 0.5)
    statuses = {"OK": n_ok, **errors}
    assert sum(statuses.values()) == n_measured
    steady = price / thr * 1000 / 3600
    n = len(sched)
    return {
        "schema": 1,
        "device": device,
        # the fixture's ServerInfo (tests/analysis_fixtures.py): one process, so no workers there
        "server_config": {
            "dtype": "float32",
            "max_batch_size": 8,
            "max_queue_delay_ms": 2.0,
            "instances": 1,
            "pre_threads": 2,
            "workers": 0,
            "slots_per_worker": 0,
            "intra_op_threads": 4,
        },
        "latency_ms": latency,
        "latency_ci_ms": {"draws": BOOT, "confidence": 0.95},
        "enough_samples": {"p99": _enough(lat_sorted, 0.99, 299), "p999": _enough(lat_sorted, 0.999, 2995)},
        "service_ms": _summary(service),
        "throughput_rps": thr,
        "offered_rps": RATE,
        "errors": errors,
        "batch_size_mean": float(raw["batch_size"][ok].mean()),
        "statuses": statuses,
        "error_rate": (n_measured - n_ok) / n_measured,
        "send_lag_ms": _summary(lag_all[measured & ~np.isnan(sent)]),
        "phases_ms": {
            **{p: _phase(v) for p, v in cols.items()},
            "server_total": _phase(total),
            "service": _summary(service),
        },
        "tail": {
            "median_band": [0.45, 0.55],
            "median_band_ms": band_ms,
            "p99": tail99,
            "p999": tail999,
            "dominant": tail99["dominant"],
        },
        "cold_start_s": 4.0,
        "cold_start": COLD_START,
        "cost_per_1k": steady,
        "cost": {
            "price_per_hour": price,
            "slo_p99_ms": SLO,
            "slo_held": True,
            "note": None,
            "cost_per_1k_measured": steady,
            "autoscale": auto,
        },
        "valid": True,
        "window_s": {"start": WARMUP, "end": DURATION, "duration": window},
        "counts": {
            "rows": n,
            "measured": n_measured,
            "ok": n_ok,
            "completed_in_window": n_done,
            "dropped": 0,
            "warmup": n - n_measured,
        },
        "drift": {"first_half_p50_ms": first, "second_half_p50_ms": second, "ratio": second / first},
        "config": {
            "arrival": "poisson",
            "rate": RATE,
            "duration_s": window,
            "warmup_s": WARMUP,
            "mode": "open",
            "max_send_lag_ms": 5.0,
        },
        "trace": {
            "digest": "d" * 64,
            "source": f"synthetic:poisson rate={RATE}",
            "requests": n,
            "duration_s": (n - 1) / RATE,
            "mean_rate": RATE,
        },
    }


def sweep_point(run: Path, rate: float, batch: float, device: str) -> dict[str, Any]:
    raw = raw_rows(run)
    ok = ~raw["warmup"].astype(bool) & (raw["status"] == "OK")
    return {
        "run_dir": str(run),
        "offered_rps": rate,
        # completions inside the window [warm-up end, 4 s) per second
        "throughput_rps": completed(raw, 1.0, 4.0) / 3.0,
        "p99_ms": _pct((raw["done_ns"] - raw["scheduled_ns"])[ok] / 1e6, 0.99),
        "error_rate": 0.0,
        "valid": True,
        "batch_size_mean": batch,
        "device": device,
    }


# -- flattening and comparison -----------------------------------------------------------------


def _leaves(o: Any, path: str, numeric: bool) -> dict[str, Any]:
    """Leaves of a JSON value by path (``.a.b[2]``): numbers (not bools), or everything else."""
    out: dict[str, Any] = {}
    if isinstance(o, dict):
        for k, v in o.items():
            out.update(_leaves(v, f"{path}.{k}", numeric))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            out.update(_leaves(v, f"{path}[{i}]", numeric))
    elif (isinstance(o, int | float) and not isinstance(o, bool)) == numeric:
        out[path] = o
    return out


def numbers(o: Any, path: str = "") -> dict[str, float]:
    """Every number (not bool) in a JSON value, by path."""
    return _leaves(o, path, True)


def others(o: Any, path: str = "") -> dict[str, Any]:
    """Every non-number leaf (strings, bools, None) by path."""
    return _leaves(o, path, False)


def check_numbers(got: dict[str, Any], want: dict[str, Any], prefix: str, skip: tuple[str, ...]) -> set[str]:
    g = {k: v for k, v in numbers(got, prefix).items() if not k.startswith(skip)}
    w = numbers(want, prefix)
    assert set(g) - set(w) == set(), "numbers in report.json without a known answer"
    assert set(w) - set(g) == set(), "expected numbers missing from report.json"
    for k, v in w.items():
        assert isinstance(g[k], int) == isinstance(v, int) or isinstance(v, float), k
        assert g[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    return set(g)


def bracket(ci: list[float] | None, value: float) -> None:
    assert ci is not None and len(ci) == 2
    assert ci[0] <= value <= ci[1] or ci[0] == pytest.approx(value) or ci[1] == pytest.approx(value)


# -- the runs ---------------------------------------------------------------------------------
