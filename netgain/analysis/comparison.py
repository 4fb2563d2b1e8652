"""Baseline vs treatment: refuse different traffic, ratios with confidence intervals, the verdict."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from netgain.analysis import cost, pricing
from netgain.analysis.run_summary import RunResult
from netgain.analysis.rundir import AnalysisError
from netgain.analysis.stats import interval
from netgain.contract.report import Comparison, Ratios, RunReport

# A number standing alone in a description ("rate=200.0", "seed=0"), not part of a word or path
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def _canon(value: Any) -> Any:
    """A traffic field where formatting does not matter: numbers as floats, numbers in text as repr(float)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return _NUMBER.sub(lambda m: repr(float(m.group(0))), value.strip())
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    ca, cb = _canon(a), _canon(b)
    if isinstance(ca, float) and isinstance(cb, float):
        return math.isclose(ca, cb, rel_tol=1e-9, abs_tol=1e-12)
    return bool(ca == cb)


def traffic_differences(base: dict[str, Any], treat: dict[str, Any]) -> list[str]:
    """What differs between the two runs' traffic, ignoring how numbers were formatted.

    The trace digest covers every arrival time, payload size and items count. When both digests
    are present and equal, the descriptions (``trace.source``, ``config.arrival``) are not
    compared: the same schedule written ``rate=200`` or ``rate=200.0`` (or read from another path)
    is the same traffic. Without a usable digest they are compared, numbers normalised.
    The fields that define traffic beyond the schedule (open/closed mode, concurrency, think
    time, rate, request count, mean rate, payload settings, model) are always compared.
    """
    diffs: list[str] = []
    bt, tt = base.get("trace") or {}, treat.get("trace") or {}
    same_digest = False
    if not bt.get("digest") or not tt.get("digest"):
        diffs.append("a trace digest is missing from meta.json, so identical traffic cannot be verified")
    elif bt["digest"] != tt["digest"]:
        diffs.append(f"trace digest differs ({str(bt['digest'])[:12]} vs {str(tt['digest'])[:12]})")
    else:
        same_digest = True
    bc, tc = base.get("config") or {}, treat.get("config") or {}
    config_keys = ("rate", "mode", "concurrency", "think_ms", "payload", "payloads")
    for key in config_keys if same_digest else ("arrival", *config_keys):
        if not _same(bc.get(key), tc.get(key)):
            diffs.append(f"config.{key} differs ({bc.get(key)!r} vs {tc.get(key)!r})")
    for key in ("mean_rate", "requests") if same_digest else ("source", "mean_rate", "requests"):
        if not _same(bt.get(key), tt.get(key)):
            diffs.append(f"trace.{key} differs ({bt.get(key)!r} vs {tt.get(key)!r})")
    bm, tm = (base.get("server") or {}).get("model"), (treat.get("server") or {}).get("model")
    if bm != tm:
        diffs.append(f"server model differs ({bm!r} vs {tm!r})")
    return diffs


def check_comparable(base: dict[str, Any], treat: dict[str, Any], force: bool) -> list[str]:
    diffs = traffic_differences(base, treat)
    if diffs and not force:
        raise AnalysisError(
            "refusing to compare runs with different traffic: "
            + "; ".join(diffs)
            + " (replay the same --trace on both, or pass --force)"
        )
    return diffs


def _ratio_ci(num: np.ndarray, den: np.ndarray, scale: float = 1.0) -> list[float] | None:
    m = min(len(num), len(den))
    if m == 0:
        return None
    d = den[:m]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = scale * num[:m] / d
    r = r[np.isfinite(r)]
    return interval(r)


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def maintainability(treat: dict[str, Any], base: dict[str, Any]) -> list[str]:
    tv = (treat.get("versions") or {}).get("server") or {}
    tdev = str((treat.get("server") or {}).get("device") or "")
    bdev = str((base.get("server") or {}).get("device") or "")
    if not tdev.startswith("cuda") or bdev.startswith("cuda"):
        return []
    return [
        f"CUDA {tv.get('cuda') or 'unknown'} and driver {tv.get('driver') or 'unknown'} must be pinned "
        f"together with torch {tv.get('torch') or 'unknown'}; every upgrade is a three-way "
        "compatibility check",
        f"a second deployment target to build, patch and capacity-plan (GPU nodes, {tv.get('gpu') or 'GPU'} "
        "images with the NVIDIA runtime) beside the CPU one",
        "harder local development and debugging: developers without a GPU test a different code path",
        f"GPU cold start {_seconds(treat.get('_cold_start_s'))} per scale-up (process start to ready)",
    ]


def effective_cost(r: RunReport) -> float | None:
    """Cost per 1k under the autoscaling replay (cold start and idle included), else steady."""
    auto = r["cost"]["autoscale"] or {}
    return auto.get("cost_per_1k") if auto.get("cost_per_1k") is not None else r["cost_per_1k"]


def _autoscaled_draws(res: RunResult) -> np.ndarray | None:
    """Autoscaled cost per 1k replayed at each bootstrap draw of this run's throughput as the capacity.

    None when the capacity was given (a sweep or --capacity-rps: no draws for it here) or there
    are no draws. The cost depends on the capacity only through the replica counts, so replays
    are cached by them: a few distinct replays, not one per draw.
    """
    r = res.report
    auto = r["cost"]["autoscale"] or {}
    price = r["cost"]["price_per_hour"]
    if auto.get("cost_per_1k") is None or price is None or len(res.thr_draws) == 0:
        return None
    if not str(auto.get("capacity_source", "")).startswith("this run"):
        return None
    rate = np.asarray(auto["rate_rps"], dtype=np.float64)
    cache: dict[bytes, float] = {}
    out = np.full(len(res.thr_draws), np.nan)
    for i, cap in enumerate(res.thr_draws):
        if not cap > 0:
            continue
        wanted = np.maximum(auto["min_replicas"], np.ceil(rate / cap - 1e-9)).astype(np.int64).tobytes()
        if wanted not in cache:
            cache[wanted] = cost.autoscale(
                rate,
                capacity_rps=float(cap),
                cold_start_s=float(auto["cold_start_s"]),
                price_per_hour=price,
                min_replicas=int(auto["min_replicas"]),
                scale_down_after_s=float(auto["scale_down_after_s"]),
                bin_s=float(auto["bin_s"]),
            )["cost_per_1k"]
        out[i] = cache[wanted]
    return out


def _autoscaled_ratio_ci(base: RunResult, treat: RunResult) -> list[float] | None:
    """95 % interval of the autoscaled cost ratio from capacity draws; a given capacity counts as exact."""
    bd, td = _autoscaled_draws(base), _autoscaled_draws(treat)
    if bd is None and td is None:
        return None
    if bd is None:
        bd = np.full(len(td) if td is not None else 0, effective_cost(base.report) or np.nan)
    if td is None:
        td = np.full(len(bd), effective_cost(treat.report) or np.nan)
    return _ratio_ci(td, bd)


def _priced_ratio_ci(ratios: Ratios, value: float | None) -> tuple[list[float] | None, str]:
    """95 % interval of the priced (autoscaled) cost ratio: from its own capacity draws when a side's
    capacity is this run's throughput; else (capacities from sweeps, taken as exact) the steady
    ratio's relative interval, the throughputs' noise, applied to the priced ratio."""
    auto_ci = ratios["cost_per_1k_autoscaled"]["ci"]
    if auto_ci:
        return auto_ci, "from the capacity draws"
    steady, sci = ratios["cost_per_1k"]["value"], ratios["cost_per_1k"]["ci"]
    if value is None or not steady or not sci:
        return None, ""
    return [value * sci[0] / steady, value * sci[1] / steady], "(the steady ratio's relative interval)"


def _capacity(r: RunReport) -> float | None:
    """The replica capacity the side was priced at (a sweep, --capacity-rps, or its own run)."""
    return (r["cost"]["autoscale"] or {}).get("capacity_rps")


def _side_cost_range(rate: float, cap: dict[str, Any], price: float) -> tuple[float, float] | None:
    """(lowest, highest) steady cost per 1k at ``rate`` over a capacity bracket: the upper end of
    the bracket gives the lower cost."""
    point = cap.get("capacity_rps")
    if not point or rate <= 0:
        return None
    top = math.inf if cap.get("unbounded") or cap.get("first_missed") is None else float(cap["first_missed"])
    per = price / (rate * 3.6)
    return pricing.replicas(rate, max(top, point)) * per, pricing.replicas(rate, point) * per


def bracket_ratio(
    rate: float, caps: dict[str, dict[str, Any]], prices: tuple[float | None, float | None]
) -> tuple[float, list[float]] | None:
    """(steady cost ratio at the capacities found, [low, high] over both brackets) at ``rate``."""
    pb, pt = prices
    if not pb or not pt:
        return None
    rb = _side_cost_range(rate, caps.get("baseline") or {}, pb)
    rt = _side_cost_range(rate, caps.get("treatment") or {}, pt)
    if rb is None or rt is None:
        return None
    return rt[1] / rb[1], [rt[0] / rb[1], rt[1] / rb[0]]


def _no_rate(name: str, cap: dict[str, Any], device: str, slo: float | None) -> str:
    objective = f"p99 <= {slo:g} ms" if slo else "the SLO"
    return f"the {name} ({device}) cannot meet {objective} at any rate >= {cap.get('floor_rps', 0):g} req/s"


def _separate(ratio: float, ci: list[float], precision: float | None, duration_s: float | None) -> str:
    """What would separate an interval straddling 1: a finer search, or longer runs."""
    gap, half = abs(ratio - 1.0), max(ratio - ci[0], ci[1] - ratio)
    if gap < 0.005 or half <= 0:
        return "the two cost the same within 0.5 % here: a tie no further run will break"
    if precision is not None:
        return f"a search to --precision {precision * gap / half * 0.8:.2g} would separate them"
    if duration_s:
        return f"runs of about {duration_s * (half / gap) ** 2 * 1.2:.0f} s each would separate them"
    return "longer runs would separate them"


def compare(
    base: RunResult,
    treat: RunResult,
    *,
    slo_p99_ms: float | None,
    diffs: list[str],
    capacities: dict[str, dict[str, Any]] | None = None,
) -> Comparison:
    b, t = base.report, treat.report
    bp = b["cost"]["price_per_hour"]
    tp = t["cost"]["price_per_hour"]
    price_ratio = tp / bp if tp is not None and bp else None
    ratios: Ratios = {
        "p99": {
            "value": _div(t["latency_ms"]["p99"], b["latency_ms"]["p99"]),
            "ci": _ratio_ci(treat.p99_draws, base.p99_draws),
        },
        "p50": {"value": _div(t["latency_ms"]["p50"], b["latency_ms"]["p50"]), "ci": None},
        "throughput": {
            "value": _div(t["throughput_rps"], b["throughput_rps"]),
            "ci": _ratio_ci(treat.thr_draws, base.thr_draws),
        },
        # cost ratio = (price_t / price_b) * (thr_b / thr_t): its uncertainty is the throughputs'
        "cost_per_1k": {
            "value": _div(t["cost"]["cost_per_1k_measured"], b["cost"]["cost_per_1k_measured"]),
            "ci": _ratio_ci(base.thr_draws, treat.thr_draws, price_ratio) if price_ratio else None,
        },
        # capacity (this run's throughput, when no sweep gave one) is the uncertain input of the replay
        "cost_per_1k_autoscaled": {
            "value": _div(effective_cost(t), effective_cost(b)),
            "ci": _autoscaled_ratio_ci(base, treat),
        },
    }
    reasons: list[str] = []
    inconclusive: list[str] = []  # why neither answer can be given
    ok = True
    for name, r in (("baseline", b), ("treatment", t)):
        if not r["valid"]:
            inconclusive.append(f"{name} run is INVALID ({'; '.join(r['invalid_reasons'])}): not evidence")
    cb, ct = effective_cost(b), effective_cost(t)
    caps = capacities or {}
    devices = {n: str(r["device"] or "?") for n, r in (("baseline", b), ("treatment", t))}
    floored = [n for n in ("baseline", "treatment") if (caps.get(n) or {}).get("reached_floor")]
    for name, r, c in (("baseline", b, cb), ("treatment", t, ct)):
        if c is None and name in floored:
            continue  # a side that meets the SLO at no rate is the answer below, not a gap
        if c is None:
            note = r["cost"]["capacity_note"] or r["cost"]["note"]
            inconclusive.append(
                f"{name}'s cost at the SLO is unknown: {note or 'no capacity at the SLO'}"
                if r["cost"]["price_per_hour"] is not None
                else f"{name}'s cost per 1k is unknown: pass --price-per-hour and --baseline-price-per-hour"
            )
    cost_ratio = _div(ct, cb)
    cost_ci, ci_source = _priced_ratio_ci(ratios, cost_ratio)
    precision = None
    rate = float(t["offered_rps"] or 0.0)
    bracket = bracket_ratio(rate, caps, (bp, tp)) if capacities else None
    if bracket is not None and cost_ratio is not None:  # the capacities' brackets, not run noise
        steady, (lo, hi) = bracket
        cost_ci, ci_source = (
            [cost_ratio * lo / steady, cost_ratio * hi / steady],
            "from the capacity brackets",
        )
        precision = float((caps.get("treatment") or {}).get("precision") or 0.1)
    if floored:
        ok = ok and floored == ["baseline"]
        other = {"baseline": "treatment", "treatment": "baseline"}
        if len(floored) == 2:
            reasons.append(
                f"{_no_rate('baseline', caps['baseline'], devices['baseline'], slo_p99_ms)}, and "
                f"{_no_rate('treatment', caps['treatment'], devices['treatment'], slo_p99_ms)}: "
                "neither side meets this SLO"
            )
        else:
            n = floored[0]
            reasons.append(
                f"{_no_rate(n, caps[n], devices[n], slo_p99_ms)}: the {other[n]} ({devices[other[n]]}) "
                "is the only way to meet this SLO"
            )
    elif cb is not None and ct is not None:
        kind = "interval" if precision is not None else "95% CI"
        sure = f", {kind} [{cost_ci[0]:.3f}, {cost_ci[1]:.3f}] {ci_source}" if cost_ci else ""
        if ct < cb:
            reasons.append(
                f"cost per 1k at the SLO with cold start and idle: treatment {ct:.6f} < baseline {cb:.6f} "
                f"(x{ct / cb:.3f}{sure})"
            )
        else:
            ok = False
            reasons.append(
                f"cost per 1k at the SLO with cold start and idle: treatment {ct:.6f} >= baseline {cb:.6f} "
                f"(x{ct / cb:.3f}{sure})"
            )
        if cost_ci and cost_ci[0] < 1.0 < cost_ci[1]:
            what = (
                "the capacity brackets overlap"
                if precision is not None
                else "the difference is within the noise of the throughput measurements"
            )
            duration = t["config"]["duration_s"]
            inconclusive.append(
                f"the cost ratio's interval [{cost_ci[0]:.3f}, {cost_ci[1]:.3f}] ({ci_source}) straddles 1: "
                f"{what}; {_separate(ct / cb, cost_ci, precision, duration)}"
            )
    tp99, bp99 = t["latency_ms"]["p99"], b["latency_ms"]["p99"]
    b_hi = b["latency_ci_ms"]["p99"]
    allowed = (
        max(x for x in (slo_p99_ms, b_hi[1] if b_hi else bp99, bp99) if x is not None)
        if bp99 is not None
        else slo_p99_ms
    )
    # A baseline over the SLO at the compared rate raises the bar to its own tail: say so.
    why = f"max of SLO {slo_p99_ms} and baseline p99 upper CI" + (
        "; the baseline misses the SLO at this rate, so the bar is its tail"
        if slo_p99_ms is not None and allowed is not None and allowed > slo_p99_ms
        else ""
    )
    if tp99 is None or allowed is None:
        inconclusive.append("p99 unknown on a side: no successful requests")
    elif tp99 <= allowed:
        reasons.append(f"treatment p99 {tp99:.3f} ms <= allowed {allowed:.3f} ms ({why})")
    else:
        ok = False
        reasons.append(f"treatment p99 {tp99:.3f} ms > allowed {allowed:.3f} ms ({why})")
    auto_t = t["cost"]["autoscale"] or {}
    if auto_t.get("slo_violation_s"):
        reasons.append(
            f"treatment under autoscaling misses capacity for {auto_t['slo_violation_s']:g} s "
            f"during scale-up (cold start {float(auto_t.get('cold_start_s') or 0):.2f} s)"
        )
    if diffs:
        reasons.append("FORCED comparison despite different traffic: " + "; ".join(diffs))
    outcome = "inconclusive" if inconclusive else ("net_gain" if ok else "no_net_gain")
    reasons = [f"INCONCLUSIVE: {x}" for x in inconclusive] + reasons
    tmeta = dict(treat.meta)
    tmeta["_cold_start_s"] = t["cold_start_s"]
    return {
        "baseline": b,
        "treatment": t,
        "ratios": ratios,
        "verdict": {
            "outcome": outcome,
            "net_gain": outcome == "net_gain",
            "reasons": reasons,
            "allowed_p99_ms": allowed,
            "cost_per_1k_baseline": cb,
            "cost_per_1k_treatment": ct,
            "cost_ratio": cost_ratio,
            "cost_ratio_ci": cost_ci,
            "capacity_rps": {"baseline": _capacity(b), "treatment": _capacity(t)},
            "capacity": capacities,
            "only_side": None
            if not floored or len(floored) == 2
            else ("treatment" if floored == ["baseline"] else "baseline"),
        },
        "maintainability": maintainability(tmeta, base.meta),
        "traffic_differences": diffs,
    }


def _seconds(value: Any) -> str:
    """``2.6 s``, or ``n/a`` when the run has no cold start."""
    return "n/a" if value is None else f"{float(value):.1f} s"
