"""Fit arrival models to a trace: poisson, gamma (burstiness), on/off bursts, diurnal.

Goodness of fit: a trace is synthesized from each fit (seed 0, at least 20,000 requests) and
compared with the data by two-sample Kolmogorov-Smirnov statistics on two time scales:
inter-arrival times (short range) and request counts per bin (long range: bursts, ramps).
Each statistic is divided by its 95 % critical value; ``score`` is the larger ratio, so a
score <= 1 means the data are consistent with the model at both scales. ``best`` is the
simplest model (poisson, gamma, diurnal, onoff, in that order) with score <= 1, else the
model with the lowest score.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netgain.loadgen.traces.model import Trace
from netgain.loadgen.traces.synth import synthesize

MODELS = ("poisson", "gamma", "diurnal", "onoff")  # simplest first
GOF_SEED = 0
GOF_MIN_REQUESTS = 20_000
GOF_MAX_REQUESTS = 2_000_000


def ks_2samp(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: max distance between the empirical CDFs."""
    if a.shape[0] == 0 or b.shape[0] == 0:
        return 1.0
    a, b = np.sort(a), np.sort(b)
    both = np.concatenate([a, b])
    fa = np.searchsorted(a, both, side="right") / a.shape[0]
    fb = np.searchsorted(b, both, side="right") / b.shape[0]
    return float(np.max(np.abs(fa - fb)))


def _crit(n: int, m: int) -> float:
    return 1.358 * math.sqrt((n + m) / (n * m)) if n and m else 1.0


def _counts(t: np.ndarray, bin_s: float) -> np.ndarray:
    t = t - t[0]
    nb = max(int(t[-1] // bin_s), 1)  # whole bins only
    return np.bincount(np.minimum((t // bin_s).astype(np.int64), nb), minlength=nb + 1)[:nb]


def _goodness(t: np.ndarray, params: dict[str, Any], bin_s: float) -> dict[str, float]:
    n = t.shape[0]
    span = float(t[-1] - t[0])
    scale = min(max(1.0, GOF_MIN_REQUESTS / n), GOF_MAX_REQUESTS / n)
    sim = synthesize(duration_s=span * scale, seed=GOF_SEED, **params).t_s
    if sim.shape[0] < 3:
        return {"ks_interarrival": 1.0, "ks_counts": 1.0, "score": 1e9}
    ga, gb = np.diff(t), np.diff(sim)
    ca, cb = _counts(t, bin_s), _counts(sim, bin_s)
    ks_g, ks_c = ks_2samp(ga, gb), ks_2samp(ca, cb)
    score = max(ks_g / _crit(ga.shape[0], gb.shape[0]), ks_c / _crit(ca.shape[0], cb.shape[0]))
    return {"ks_interarrival": round(ks_g, 6), "ks_counts": round(ks_c, 6), "score": round(score, 4)}


def _fit_onoff(t: np.ndarray, g: np.ndarray, rate: float) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Off periods are gaps over 20x the median gap; bursts are the runs between them."""
    pos = g[g > 0]
    if pos.shape[0] < 2:
        return None, {"note": "no positive inter-arrival times"}
    tau = 20.0 * float(np.median(pos))
    off = np.flatnonzero(g >= tau)
    if off.shape[0] < 2:
        return None, {"note": f"fewer than 2 silent gaps longer than {tau:.3g} s: no on/off structure"}
    within = g[g < tau]
    burst_rate = within.shape[0] / float(within.sum()) if within.sum() > 0 else math.inf
    starts = np.concatenate([[0], off + 1])
    ends = np.concatenate([off, [t.shape[0] - 1]])
    spans = t[ends] - t[starts]
    cycle = float(t[starts[-1]] - t[starts[0]]) / (starts.shape[0] - 1)
    on_s = min(float(spans.mean()) + 2.0 / burst_rate, cycle)
    off_s = max(cycle - on_s, 0.0)
    params = {"arrival": "onoff", "rate": rate, "on_s": on_s, "off_s": off_s}
    return params, {"burst_rate": burst_rate, "bursts": int(starts.shape[0]), "gap_threshold_s": tau}


def _fit_diurnal(t: np.ndarray, rate: float) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Period and amplitude from the FFT peak of binned counts, refined on a fine frequency grid."""
    span = float(t[-1] - t[0])
    nb = 2048
    counts = np.bincount(np.minimum(((t - t[0]) / span * nb).astype(np.int64), nb - 1), minlength=nb).astype(
        np.float64
    )
    mean = counts.mean()
    x = counts - mean
    power = np.abs(np.fft.rfft(x)) ** 2
    if power.shape[0] <= 2:
        return None, {"note": "too short"}
    k = int(np.argmax(power[2:])) + 2  # at least two periods in the trace
    freqs = np.linspace(max(k - 1.0, 1.5), k + 1.0, 201)
    j = np.arange(nb)
    dft = np.exp(-2j * np.pi * np.outer(freqs, j) / nb) @ x
    best = int(np.argmax(np.abs(dft)))
    f = float(freqs[best])
    amplitude = min(float(2.0 * abs(dft[best]) / (nb * mean)), 1.0)
    params = {"arrival": "diurnal", "rate": rate, "period_s": span / f, "amplitude": amplitude}
    return params, {
        "phase_rad": float((np.angle(dft[best]) + np.pi / 2) % (2 * np.pi)),
        "periods_in_trace": f,
    }


def _fit_sizes(size: np.ndarray) -> dict[str, Any]:
    pos = size[size > 0]
    if pos.shape[0] == 0:
        return {"size_bytes": 0, "size_sigma": 0.0}
    logs = np.log(pos.astype(np.float64))
    return {
        "size_bytes": round(float(np.exp(np.median(logs)))),
        "size_sigma": round(float(logs.std()), 4),
    }


def _fit_items(items: np.ndarray) -> str:
    values, counts = np.unique(items, return_counts=True)
    if values.shape[0] == 1:
        return str(int(values[0]))
    p = counts / counts.sum()
    return ",".join(f"{int(v)}:{q:.4g}" for v, q in zip(values, p, strict=True))


def fit(trace: Trace) -> dict[str, Any]:
    """Fit each arrival model; see the module docstring for ``score`` and ``best``.

    Each model's ``params`` are ``synthesize`` keyword arguments; ``size`` and ``items`` hold
    the size (lognormal median and sigma) and items fits. ``params_from_fit`` merges them.
    """
    n = len(trace)
    if n < 3 or trace.t_s[-1] <= trace.t_s[0]:
        raise ValueError(f"fitting needs at least 3 requests spread over time; this trace has {n}")
    t = trace.t_s
    g = np.diff(t)
    span = float(t[-1] - t[0])
    rate = (n - 1) / span
    mean_g = float(g.mean())
    cv = float(g.std() / mean_g)
    pos = g[g > 0]
    cv_mle = None
    if pos.shape[0] > 2:
        s = math.log(float(pos.mean())) - float(np.log(pos).mean())
        if s > 0:
            shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
            cv_mle = round(1 / math.sqrt(shape), 4)
    bin_s = max(span / 2000, 5.0 / rate)
    models: dict[str, dict[str, Any]] = {
        "poisson": {"params": {"arrival": "poisson", "rate": rate}},
        "gamma": {"params": {"arrival": "gamma", "rate": rate, "cv": max(cv, 1e-3)}, "cv_mle": cv_mle},
    }
    for name, (params, extra) in (("diurnal", _fit_diurnal(t, rate)), ("onoff", _fit_onoff(t, g, rate))):
        models[name] = {"params": params, **extra}
    for entry in models.values():
        if entry["params"] is not None:
            entry.update(_goodness(t, entry["params"], bin_s))
    fitted = [m for m in MODELS if models[m]["params"] is not None]
    consistent = [m for m in fitted if models[m]["score"] <= 1.0]
    best = consistent[0] if consistent else min(fitted, key=lambda m: models[m]["score"])
    return {
        "requests": n,
        "duration_s": trace.duration_s,
        "source": trace.source,
        **models,
        "size": _fit_sizes(trace.size),
        "items": _fit_items(trace.items),
        "count_bin_s": bin_s,
        "best": best,
    }


def params_from_fit(result: dict[str, Any], model: str = "best") -> dict[str, Any]:
    """``synthesize`` keyword arguments (arrival model, sizes, items) from a ``fit`` result."""
    name = result["best"] if model == "best" else model
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose best or one of {', '.join(MODELS)}")
    params = result.get(name, {}).get("params")
    if params is None:
        raise ValueError(f"the {name} model did not fit this trace: {result.get(name, {}).get('note', '')}")
    return {**params, **result["size"], "items": result["items"]}
