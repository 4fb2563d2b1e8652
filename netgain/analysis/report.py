"""build_report: one run, a rate sweep, or baseline vs treatment → the report dict (report.json)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

from netgain.analysis import comparison as cmp
from netgain.analysis.cost import capacity_from_points
from netgain.analysis.run_summary import analyze
from netgain.analysis.rundir import AnalysisError, load_meta
from netgain.contract import rundir as files
from netgain.contract.report import Report, RunReport, Sweep, SweepPoint


def sweep_points(
    run_dirs: list[str | Path], *, slo_p99_ms: float | None = None, warmup_s: float | None = None
) -> list[SweepPoint]:
    """One summary point per run of a rate (or batch-size) sweep."""
    points: list[SweepPoint] = []
    for d in run_dirs:
        r = analyze(d, slo_p99_ms=slo_p99_ms, warmup_s=warmup_s, bootstrap=0).report
        points.append(
            {
                "run_dir": str(d),
                "offered_rps": r["offered_rps"],
                "throughput_rps": r["throughput_rps"],
                "p99_ms": r["latency_ms"]["p99"],
                "error_rate": r["error_rate"],
                "valid": r["valid"],
                "batch_size_mean": r["batch_size_mean"],
                "device": r["device"],
            }
        )
    return points


def capacity_at_slo(
    run_dirs: list[str | Path],
    *,
    slo_p99_ms: float | None = None,
    max_error_rate: float | None = None,
    warmup_s: float | None = None,
) -> Sweep:
    """Per-replica capacity at the SLO from several runs at different rates: the best valid throughput."""
    if not run_dirs:
        raise AnalysisError("capacity at SLO needs at least one run directory")
    cfg = load_meta(run_dirs[0]).get("config") or {}
    if slo_p99_ms is None:
        slo_p99_ms = cfg.get("slo_p99_ms")
    if max_error_rate is None:
        # the same SLO as a single run's: p99 and, when configured, the error rate
        max_error_rate = cfg.get("max_error_rate")
    points = sweep_points(run_dirs, slo_p99_ms=slo_p99_ms, warmup_s=warmup_s)
    out = capacity_from_points(cast(list[dict[str, Any]], points), slo_p99_ms, max_error_rate)
    out["points"] = points
    return cast(Sweep, out)


def build_report(
    run_dir: str | Path,
    *,
    baseline_dir: str | Path | None = None,
    price_per_hour: float | None = None,
    baseline_price_per_hour: float | None = None,
    slo_p99_ms: float | None = None,
    span_log: str | Path | None = None,
    bootstrap: int = 200,
    seed: int = 0,
    force: bool = False,
    warmup_s: float | None = None,
    sweep_dirs: list[str | Path] | None = None,
    baseline_sweep_dirs: list[str | Path] | None = None,
    capacity_rps: float | None = None,
    baseline_capacity_rps: float | None = None,
    capacities: dict[str, dict[str, Any]] | None = None,
    min_replicas: int = 1,
    scale_down_after_s: float = 60.0,
) -> Report:
    """The full report for ``run_dir`` (the treatment when ``baseline_dir`` is given).

    ``capacity_rps``/``baseline_capacity_rps``: each side's capacity at the SLO when found elsewhere
    (the capacity search); ``capacities``: both sides' search brackets (``Capacity.to_dict()``), which
    the verdict reads (a side that meets the SLO at no rate is an answer). Prices and the SLO default
    to each run's meta.json config. Raises AnalysisError (a NetgainError)
    for unreadable runs and for comparisons of different traffic unless ``force``.
    """
    if bootstrap < 0:
        raise AnalysisError("--bootstrap must be >= 0")
    for name, v in (
        ("price per hour", price_per_hour),
        ("baseline price per hour", baseline_price_per_hour),
        ("SLO p99", slo_p99_ms),
        ("capacity", capacity_rps),
        ("baseline capacity", baseline_capacity_rps),
    ):
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise AnalysisError(f"{name} must be a positive number, got {v}")
    tmeta = load_meta(run_dir)
    bmeta = load_meta(baseline_dir) if baseline_dir is not None else None
    diffs = cmp.check_comparable(bmeta, tmeta, force) if bmeta is not None else []
    slo = slo_p99_ms if slo_p99_ms is not None else (tmeta.get("config") or {}).get("slo_p99_ms")
    if slo is None and bmeta is not None:
        slo = (bmeta.get("config") or {}).get("slo_p99_ms")
    sweep = capacity_at_slo(sweep_dirs, slo_p99_ms=slo, warmup_s=warmup_s) if sweep_dirs else None
    cap = capacity_rps or (sweep["capacity_rps"] if sweep else None)
    common: dict[str, Any] = {
        "slo_p99_ms": slo,
        "warmup_s": warmup_s,
        "bootstrap": bootstrap,
        "min_replicas": min_replicas,
        "scale_down_after_s": scale_down_after_s,
    }
    treat = analyze(
        run_dir, price_per_hour=price_per_hour, span_log=span_log, seed=seed, capacity_rps=cap, **common
    )
    # the run's keys, then the report's in their written order: "comparison" last, set below
    report = cast(Report, dict(treat.report))
    report["slo_p99_ms"] = slo
    report["failed_headline"] = failed_headline(report)
    if sweep is not None:
        report["sweep"] = sweep
    if bmeta is not None and baseline_dir is not None:
        bsweep = (
            capacity_at_slo(baseline_sweep_dirs, slo_p99_ms=slo, warmup_s=warmup_s)
            if baseline_sweep_dirs
            else None
        )
        base = analyze(
            baseline_dir,
            price_per_hour=baseline_price_per_hour,
            seed=seed + 1,
            capacity_rps=baseline_capacity_rps or (bsweep["capacity_rps"] if bsweep else None),
            **common,
        )
        if bsweep is not None:
            base.report["sweep"] = bsweep
        report.update(cmp.compare(base, treat, slo_p99_ms=slo, diffs=diffs, capacities=capacities))
        report["comparison"] = True
        report["warnings"] = [*report["warnings"], *(f"baseline: {w}" for w in base.report["warnings"])]
    else:
        report["comparison"] = False
    return report


def failed_headline(r: RunReport) -> str:
    """The headline's words for the measured requests that failed ("" when none did): "TARGET WENT
    AWAY" when a tenth or more were UNAVAILABLE (the server died, refused or was unreachable), as
    ``netgain load``'s last line says; "REQUESTS FAILED" for other failures. From ``errors`` and
    ``counts.measured``, which hold the numbers."""
    errors = {str(k): int(v) for k, v in (r["errors"] or {}).items()}
    if r["interrupted"]:  # the Ctrl-C's own: cut off after the drain, or never sent
        errors = {k: v for k, v in errors.items() if k not in ("CANCELLED", "NOT_SENT")}
    measured = int(r["counts"]["measured"] or 0)
    n = sum(errors.values())
    if not n or not measured:
        return ""
    unavailable = errors.get("UNAVAILABLE", 0)
    if unavailable * 10 >= measured:
        return (
            f"TARGET WENT AWAY: {unavailable} of {measured} measured requests "
            f"({unavailable / measured:.0%}) UNAVAILABLE (server gone, connection refused)"
        )
    parts = ", ".join(f"{v} {k}" for k, v in sorted(errors.items(), key=lambda kv: -kv[1]))
    return f"REQUESTS FAILED: {n} of {measured} measured ({parts})"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def clean(o: Any) -> Any:
    """NaN and infinities become null: report.json stays strict JSON."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [clean(v) for v in o]
    if hasattr(o, "item") and not hasattr(o, "__len__"):
        return clean(o.item())
    return o


def to_json(report: Report) -> str:
    return files.encode_report(clean(report), default=_json_default)


def write_outputs(report: Report, run_dir: str | Path) -> list[Path]:
    """Write report.json, report.md and report.html into ``run_dir``; return their paths."""
    from netgain.analysis.render_html import render_html
    from netgain.analysis.render_text import render_markdown

    out = Path(run_dir)
    paths = [out / name for name in files.REPORT_FILES]
    try:
        files.write_report(out, clean(report), default=_json_default)
        paths[1].write_text(render_markdown(report))
        paths[2].write_text(render_html(report))
    except OSError as exc:
        raise AnalysisError(
            f"cannot write the report into {str(out)!r} ({exc}): check its permissions"
        ) from None
    return paths
