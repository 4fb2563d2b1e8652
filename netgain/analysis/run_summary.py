"""One run directory → its report section (the numbers), plus bootstrap draws kept for comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from netgain.analysis import bottleneck as bn
from netgain.analysis import cost, resources, run_cost, stats, stream
from netgain.analysis.coverage import attribution_gaps, server_measured
from netgain.analysis.figures import Figures, latency_cdf, window
from netgain.analysis.rundir import (
    Requests,
    join_span_log,
    load_meta,
    load_requests,
    load_samples,
)
from netgain.analysis.tail import BAND, attribute, phase_matrix
from netgain.contract.phases import PHASES
from netgain.contract.report import Drift, LatencyCi, LatencyMs, Quantiles, RunConfig, RunReport
from netgain.contract.rundir import DEFAULT_MAX_SEND_LAG_MS, SCHEMA_VERSION

PLOT_METRICS = (
    "netgain_gpu_utilization_ratio",
    "netgain_gpu_sm_active_ratio",
    "netgain_kernel_busy_ratio",
    "netgain_process_cpu_ratio",
    "netgain_thread_cpu_ratio",
    "netgain_queue_depth_requests",
)


@dataclass
class RunResult:
    report: RunReport
    p99_draws: np.ndarray = field(default_factory=lambda: np.empty(0))
    thr_draws: np.ndarray = field(default_factory=lambda: np.empty(0))
    meta: dict[str, Any] = field(default_factory=dict)


def _cfg(meta: dict[str, Any]) -> dict[str, Any]:
    return meta.get("config") or {}


@dataclass
class _Rows:
    """The rows every step reads: the run's requests, its masks and its measured window."""

    req: Requests
    measured: np.ndarray  # outside the warm-up, any status
    ok: np.ndarray  # measured, OK, with a latency
    t0: float
    t1: float

    @property
    def dur(self) -> float:
        return max(self.t1 - self.t0, 1e-9)


def _load(
    run_dir: str | Path, warmup_s: float | None, span_log: str | Path | None, warnings: list[str]
) -> Requests:
    """The request rows, joined with the server's span log when one is given."""
    req = load_requests(run_dir, warmup_s=warmup_s, with_ids=span_log is not None)
    if span_log is not None:
        j = join_span_log(req, span_log)
        if j["unmatched_spans"] or j["unmatched_requests"]:
            warnings.append(
                f"span log join: {j['unmatched_requests']} sent request(s) without a server span, "
                f"{j['unmatched_spans']} span(s) without a client row"
            )
        req.request_id = None
    return req


def _statuses(rows: _Rows, meta: dict[str, Any]) -> dict[str, Any]:
    """Status counts over the measured window; dropped counted over the whole run."""
    req, measured = rows.req, rows.measured
    counts = np.bincount(req.status_code[measured], minlength=len(req.status_names))
    statuses = {name: int(c) for name, c in zip(req.status_names, counts, strict=True) if c}
    n_measured = int(measured.sum())
    n_ok = statuses.get("OK", 0)
    return {
        "statuses": statuses,
        "n_measured": n_measured,
        "n_ok": n_ok,
        "errors": {k: v for k, v in statuses.items() if k != "OK"},
        "dropped": max(
            int(req.status_mask("DROPPED").sum()), int((meta.get("counts") or {}).get("dropped") or 0)
        ),
        "error_rate": (n_measured - n_ok) / n_measured if n_measured else None,
    }


def _latency(
    lat_sorted: np.ndarray, bootstrap: int, rng: np.random.Generator
) -> tuple[dict[str, Any], np.ndarray, dict[str, Any]]:
    """(latency summary, p99 bootstrap draws, whether the tail quantiles are bounded)."""
    latency = stats.summarize(lat_sorted)
    latency["mean"] = float(lat_sorted.mean()) if len(lat_sorted) else None
    p99_draws = stats.bootstrap_quantile(lat_sorted, 0.99, bootstrap, rng)
    enough = {"p99": stats.enough_samples(lat_sorted, 0.99), "p999": stats.enough_samples(lat_sorted, 0.999)}
    return latency, p99_draws, enough


def _warn_enough(enough: dict[str, Any], warnings: list[str]) -> None:
    for k, e in enough.items():
        if not e["enough"]:
            warnings.append(
                f"{e['n']} successful requests cannot bound {k} at 95% confidence "
                f"(needs >= {e['min_samples']}): run longer or at a higher rate"
            )


def _completed(rows: _Rows) -> np.ndarray:
    """Successful requests that finished inside the measured window, whenever they were scheduled."""
    req = rows.req
    done_s = req.scheduled_s + req.latency_ms / 1e3
    ok_any = req.status_mask("OK") & ~np.isnan(req.latency_ms)
    return np.asarray(ok_any & (done_s >= rows.t0) & (done_s < rows.t1))


def _throughput(rows: _Rows, bootstrap: int, rng: np.random.Generator) -> tuple[float, int, np.ndarray]:
    """Completions per second inside the window (successful requests finished in it / its length),
    their count, and bootstrap draws of the rate (per-second bins of completion times).

    Completions, not scheduled requests: past saturation a server finishes fewer requests than
    are offered, and the offered rate (``offered_rps``) would overstate what it delivers.
    """
    req, dur = rows.req, rows.dur
    done = _completed(rows)
    n_done = int(done.sum())
    thr = n_done / dur
    n_bins = max(1, int(np.ceil(dur)))
    done_s = req.scheduled_s[done] + req.latency_ms[done] / 1e3
    bins = np.bincount(np.clip((done_s - rows.t0).astype(np.int64), 0, n_bins - 1), minlength=n_bins)[:n_bins]
    thr_draws = stats.bootstrap_rate(bins.astype(np.float64), 1.0, bootstrap, rng)
    # Centred on the exact throughput, which a partial last bin would otherwise skew.
    if len(thr_draws) and bins.mean() > 0:
        thr_draws = thr_draws * (thr / bins.mean())
    return thr, n_done, thr_draws


def _phases(
    rows: _Rows, service: dict[str, Any], lat_sorted: np.ndarray, latency: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per-phase statistics, the tail's attribution to phases)."""
    req, ok = rows.req, rows.ok
    cols = phase_matrix(
        {p: req.phases[p][ok] for p in PHASES},
        req.server_total_ms[ok],
        req.service_ms[ok],
        req.send_lag_ms[ok],
    )
    phases_ms = {p: stats.phase_stats(v) for p, v in cols.items()}
    phases_ms["server_total"] = stats.phase_stats(req.server_total_ms[ok])
    phases_ms["service"] = service
    n_lat = len(lat_sorted)
    band = (
        (float(lat_sorted[stats.rank(n_lat, BAND[0])]), float(lat_sorted[stats.rank(n_lat, BAND[1])]))
        if n_lat
        else (0.0, 0.0)
    )
    tail = attribute(
        req.latency_ms[ok], cols, req.batch_size[ok], {"p99": latency["p99"], "p999": latency["p999"]}, band
    )
    return phases_ms, tail


def _resources(
    run_dir: str | Path,
    meta: dict[str, Any],
    rows: Figures,
    send_lag: dict[str, Any],
    dropped: int,
    warnings: list[str],
    span_log: str | Path | None = None,
    missed: str | None = None,
    shed: int = 0,
    p99_held: bool | None = None,
) -> dict[str, Any]:
    """GPU, CPU and queue over the window from the scraped samples, and the bottleneck they point to."""
    samples = load_samples(run_dir)
    if samples is None:
        warnings.append("no samples.parquet: GPU/CPU utilization and the bottleneck kind are unknown")
    ser = resources.series(samples, rows.t0, rows.t1)
    gpu, cpu, queue = resources.summarize_resources(ser, meta, rows.dur, resources.requests_by_pid(span_log))
    max_lag = float(_cfg(meta).get("max_send_lag_ms") or DEFAULT_MAX_SEND_LAG_MS)
    server = meta.get("server") or {}
    device = str(server.get("device") or "unknown")
    options = server.get("handler_options") or {}
    # The image handlers decode on the CPU unless told: on a GPU their decode can move there.
    decode_lever = (
        server.get("model") in ("image", "resnet50")
        and device.startswith("cuda")
        and options.get("decode") != "gpu"
    )
    precision_lever = device.startswith("cuda") and (server.get("dtype") or "float32") == "float32"
    bott = bn.classify(
        gpu,
        cpu,
        queue,
        device=device,
        send_lag_p99_ms=send_lag["p99"],
        max_send_lag_ms=max_lag,
        dropped=dropped,
        server_known=server_measured(meta),
        missed=missed,
        shed=shed,
        decode_lever=decode_lever,
        precision_lever=precision_lever,
        p99_held=p99_held,
    )
    return {"series": ser, "gpu": gpu, "cpu": cpu, "queue": queue, "device": device, "bottleneck": bott}


def _validity(meta: dict[str, Any], send_lag: dict[str, Any], dropped: int) -> tuple[bool, list[str]]:
    """The load generator's own verdict, then ours: (valid, reasons)."""
    max_lag = float(_cfg(meta).get("max_send_lag_ms") or DEFAULT_MAX_SEND_LAG_MS)
    validity = meta.get("validity") or {}
    reasons = [str(r) for r in validity.get("reasons") or []]
    if validity.get("valid") is False and not reasons:
        reasons.append("meta.json marks the run invalid")
    if meta.get("interrupted_at_s") is not None and not any("interrupted" in r for r in reasons):
        reasons.insert(0, f"interrupted at {float(meta['interrupted_at_s']):.1f} s (Ctrl-C): a partial run")
    if send_lag["p99"] is not None and send_lag["p99"] > max_lag:
        reasons.append(
            f"send lag p99 {send_lag['p99']:.3f} ms > max_send_lag_ms {max_lag:g}: "
            "the load generator fell behind its schedule"
        )
    if dropped:
        reasons.append(
            f"{dropped} request(s) dropped at the in-flight cap: raise --max-in-flight or add workers"
        )
    return validity.get("valid") is not False and not reasons, reasons


def _warn_drift(drift: dict[str, Any], warnings: list[str]) -> None:
    """Median latency of the window's first half against its second: is this steady state?"""
    if drift["ratio"] is not None and not 0.8 <= drift["ratio"] <= 1.25:
        warnings.append(
            f"median latency drifted x{drift['ratio']:.2f} from the first to the second half: "
            "not steady state (longer warm-up, or a growing queue)"
        )


def _in_memory(
    run_dir: str | Path,
    meta: dict[str, Any],
    warmup_s: float | None,
    span_log: str | Path | None,
    bootstrap: int,
    rng: np.random.Generator,
    warnings: list[str],
) -> Figures:
    """The figures from every request row held in memory (runs up to ``stream.STREAM_ABOVE_ROWS``)."""
    req = _load(run_dir, warmup_s, span_log, warnings)
    t0, t1 = window(meta, req.scheduled_s, warmup_s)
    measured = ~req.warmup
    if meta.get("interrupted_at_s") is not None:  # what the Ctrl-C cut off was never measured
        measured &= req.scheduled_s < t1
    ok = measured & req.status_mask("OK") & ~np.isnan(req.latency_ms)
    rows = _Rows(req, measured, ok, t0, t1)
    st = _statuses(rows, meta)
    lat_sorted = np.sort(req.latency_ms[ok])
    latency, p99_draws, enough = _latency(lat_sorted, bootstrap, rng)  # rng: p99 first, then throughput
    send_lag = stats.summarize(np.sort(req.send_lag_ms[measured & ~np.isnan(req.send_lag_ms)]))
    service = stats.summarize(np.sort(req.service_ms[ok]))
    thr, n_done, thr_draws = _throughput(rows, bootstrap, rng)
    phases_ms, tail = _phases(rows, service, lat_sorted, latency)
    answered = measured & ~np.isnan(req.latency_ms)
    batch_ok = req.batch_size[ok]
    return Figures(
        rows=req.n,
        warmup=int(req.warmup.sum()),
        t0=t0,
        t1=t1,
        statuses=st,
        latency=latency,
        p99_draws=p99_draws,
        enough=enough,
        send_lag=send_lag,
        service=service,
        throughput=thr,
        completed=n_done,
        thr_draws=thr_draws,
        phases_ms=phases_ms,
        tail=tail,
        drift=stats.drift(req.latency_ms[ok], req.scheduled_s[ok]),
        batch_size_mean=float(np.nanmean(batch_ok)) if np.any(~np.isnan(batch_ok)) else None,
        offered=int(measured.sum()),
        arrival_rate=cost.arrival_rate(req.scheduled_s, 1.0, t1),
        # what a target without netgain's trailers or ServerInfo leaves unattributed
        gaps=attribution_gaps(req.server_total_ms[ok], meta, req.server_total_ms[answered]),
        latency_cdf=latency_cdf(lat_sorted),
        join=req.join,
    )


def analyze(
    run_dir: str | Path,
    *,
    price_per_hour: float | None = None,
    slo_p99_ms: float | None = None,
    warmup_s: float | None = None,
    span_log: str | Path | None = None,
    bootstrap: int = 200,
    seed: int = 0,
    capacity_rps: float | None = None,
    min_replicas: int = 1,
    scale_down_after_s: float = 60.0,
) -> RunResult:
    meta = load_meta(run_dir)
    cfg = _cfg(meta)
    price = price_per_hour if price_per_hour is not None else cfg.get("price_per_hour")
    slo = slo_p99_ms if slo_p99_ms is not None else cfg.get("slo_p99_ms")
    warnings: list[str] = []
    rng = np.random.default_rng(seed)  # drawn from in this order: p99, then throughput
    if stream.streams(run_dir, span_log):
        fig = stream.figures(run_dir, meta, warmup_s, bootstrap, rng)
    else:
        fig = _in_memory(run_dir, meta, warmup_s, span_log, bootstrap, rng, warnings)
    _warn_enough(fig.enough, warnings)
    st, latency, send_lag, thr = fig.statuses, fig.latency, fig.send_lag, fig.throughput
    p99_draws, thr_draws = fig.p99_draws, fig.thr_draws
    latency_ci: LatencyCi = {"p99": stats.interval(p99_draws), "draws": len(p99_draws), "confidence": 0.95}
    valid, reasons = _validity(meta, send_lag, st["dropped"])
    slo_held = run_cost.slo_held(slo, latency["p99"], cfg.get("max_error_rate"), st["error_rate"], warnings)
    missed = None if slo_held is not False else run_cost.missed(latency["p99"], slo or 0.0)
    if slo_held is False and latency["p99"] is not None and latency["p99"] <= (slo or 0.0):
        missed = f"error rate {st['error_rate']:.4f} > max_error_rate {cfg.get('max_error_rate')}"
    shed = st["statuses"].get("RESOURCE_EXHAUSTED", 0)
    p99_held = None if not slo or latency["p99"] is None else latency["p99"] <= slo
    res = _resources(run_dir, meta, fig, send_lag, st["dropped"], warnings, span_log, missed, shed, p99_held)
    costs = run_cost.section(
        meta,
        fig.arrival_rate,
        price=price,
        slo=slo,
        slo_held=slo_held,
        p99=latency["p99"],
        thr=thr,
        valid=valid,
        capacity_rps=capacity_rps,
        min_replicas=min_replicas,
        scale_down_after_s=scale_down_after_s,
    )
    _warn_drift(fig.drift, warnings)
    warnings.extend(fig.gaps)

    report: RunReport = {
        "schema": SCHEMA_VERSION,
        "run_dir": str(run_dir),
        "run_id": meta.get("run_id"),
        "device": res["device"],
        "model": (meta.get("server") or {}).get("model"),
        "server_config": server_config(meta) if server_measured(meta) else None,
        "latency_ms": cast(LatencyMs, latency),
        "latency_ci_ms": latency_ci,
        "enough_samples": fig.enough,
        "service_ms": fig.service,
        "throughput_rps": thr,
        "throughput_ci_rps": stats.interval(thr_draws),
        "offered_rps": float(fig.offered / fig.dur),
        "errors": st["errors"],
        "batch_size_mean": fig.batch_size_mean,
        "statuses": st["statuses"],
        "error_rate": st["error_rate"],
        "send_lag_ms": cast(Quantiles, send_lag),
        "phases_ms": fig.phases_ms,
        "tail": fig.tail,
        "gpu": res["gpu"],
        "cpu": res["cpu"],
        "queue": res["queue"],
        "cold_start_s": costs["cold_start_s"],
        "cold_start": (meta.get("server") or {}).get("cold_start") or [],
        "cost_per_1k": costs["cost_per_1k"],
        "cost": costs["cost"],
        "bottleneck": res["bottleneck"],
        "valid": valid,
        # a run stopped by Ctrl-C: its rows are all there, but it is partial (never valid evidence)
        "interrupted": meta.get("interrupted_at_s") is not None,
        "invalid_reasons": reasons,
        "warnings": [f"INVALID: {r}" for r in reasons] + warnings,
        "window_s": {"start": fig.t0, "end": fig.t1, "duration": fig.dur},
        "counts": {
            "rows": fig.rows,
            "measured": st["n_measured"],
            "ok": st["n_ok"],
            "completed_in_window": fig.completed,
            "dropped": st["dropped"],
            "warmup": fig.warmup,
        },
        "drift": cast(Drift, fig.drift),
        "attribution_gaps": fig.gaps,
        "join": fig.join or None,
        "config": cast(
            RunConfig,
            {k: cfg.get(k) for k in ("arrival", "rate", "duration_s", "warmup_s", "mode", "max_send_lag_ms")},
        ),
        "trace": meta.get("trace") or {},
        "versions": meta.get("versions") or {},
        "series": {
            "latency_cdf": fig.latency_cdf,
            "utilization": resources.timeseries(res["series"], PLOT_METRICS),
        },
    }
    return RunResult(report=report, p99_draws=p99_draws, thr_draws=thr_draws, meta=meta)


def server_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The configuration the target served with, from its ServerInfo in meta.json (zeros are omitted
    there: no ``workers`` means one process)."""
    server = meta.get("server") or {}
    batching = server.get("batching") or {}
    return {
        "dtype": server.get("dtype"),
        "max_batch_size": batching.get("max_batch_size"),
        "max_queue_delay_ms": batching.get("max_queue_delay_ms"),
        "instances": batching.get("instances"),
        "pre_threads": batching.get("pre_threads"),
        "workers": int(batching.get("workers") or 0),
        "slots_per_worker": int(batching.get("slots_per_worker") or 0),
        "intra_op_threads": server.get("intra_op_threads"),
    }
