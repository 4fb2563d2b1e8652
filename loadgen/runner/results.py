"""The end of a run: rows for requests that never came back, Locust's CSV files, the counts, the
validity verdict and the exit status."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from netgain.contract import rundir as files
from netgain.contract.records import RECORD_COLUMNS, empty_columns
from netgain.loadgen.runner.config import LoadConfig
from netgain.loadgen.runner.live import LiveStats
from netgain.loadgen.schedule import Schedule

EXIT_OK, EXIT_INVALID, EXIT_SLO, EXIT_FAILED = 0, 3, 4, 5
EXIT_INTERRUPTED = 130  # Ctrl-C: every row and meta.json written, the run marked interrupted


def fill_missing(
    schedule: Schedule,
    missing: np.ndarray,
    *,
    workers: int,
    lost: dict[int, float],
    run_id: str,
    targets: list[str],
) -> dict[str, list[Any]]:
    """A row for each scheduled request without one: WORKER_LOST when its worker was lost before
    its send time, NOT_SENT otherwise. ``missing`` are those requests' positions in ``schedule``
    (a chunk of the whole schedule)."""
    fill = empty_columns()
    for pos in missing:
        idx = int(schedule.index[pos])
        worker = int(idx % workers)
        lost_at = lost.get(worker)
        t_ns = int(schedule.t_ns[pos])
        status = "WORKER_LOST" if lost_at is not None and t_ns <= lost_at * 1e9 else "NOT_SENT"
        row: dict[str, Any] = {c: None for c in RECORD_COLUMNS}
        row.update(
            index=int(idx),
            request_id=f"{run_id}-{idx}",
            worker=worker,
            target=targets[int(idx) % len(targets)],
            warmup=t_ns < schedule.warmup_ns,
            scheduled_ns=t_ns,
            status=status,
            items=int(schedule.items[pos]),
            request_bytes=0,
            response_bytes=0,
        )
        for c in RECORD_COLUMNS:
            fill[c].append(row[c])
    return fill


def write_locust_csv(env: Any, out: str) -> None:
    """Locust's own statistics (fed by the workers' request events), as its --csv would write
    them: the familiar view, millisecond-rounded; requests.parquet is the exact record."""
    import csv

    if env is None:
        return
    from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

    writer = StatsCSV(env, PERCENTILES_TO_REPORT)
    for name, write in (
        (files.LOCUST_STATS, writer.requests_csv),
        (files.LOCUST_FAILURES, writer.failures_csv),
    ):
        with open(os.path.join(out, name), "w", newline="") as fh:
            write(csv.writer(fh))


def count(scheduled: int, live: LiveStats, not_sent: int, worker_lost: int, rows: int) -> dict[str, int]:
    """meta.json's ``counts``: what was scheduled, sent, answered, and how it ended."""
    return {
        "scheduled": scheduled,
        "sent": live.sent,
        "answered": live.sent,
        "ok": live.ok,
        "errors": live.errors,
        "dropped": live.dropped,
        "not_sent": not_sent,
        "worker_lost": worker_lost,
        "rows": rows,
    }


def invalid_reasons(
    cfg: LoadConfig, live: LiveStats, counts: dict[str, int], lost: dict[int, float], cpu: dict[int, float]
) -> list[str]:
    """Why the run is not a valid measurement; empty when it is."""
    reasons = []
    # Decided exactly as the report's validity check; the figure shown is the histogram's.
    if cfg.mode == "open" and live.send_lag_exceeded():
        reasons.append(
            f"send-lag p99 {live.lag_ms(0.99):.2f} ms > {cfg.max_send_lag_ms} ms: the generator fell behind"
        )
    if counts["dropped"]:
        reasons.append(f"{counts['dropped']} requests dropped at the in-flight cap ({cfg.max_in_flight})")
    if lost:
        reasons.append(f"worker(s) {sorted(lost)} lost: the run is partial")
    if counts["not_sent"]:
        reasons.append(f"{counts['not_sent']} scheduled requests were never sent")
    busy = {w: c for w, c in cpu.items() if c >= cfg.max_worker_cpu}
    if busy:
        reasons.append(f"worker CPU saturated ({', '.join(f'{w}: {c:.0%}' for w, c in busy.items())})")
    return reasons


def interrupted_reason(at_s: float, total_s: float) -> str:
    """The validity reason of a run stopped by Ctrl-C (``netgain report`` reads it as a partial run)."""
    return f"{INTERRUPTED} at {at_s:.1f} s of {total_s:g} s (Ctrl-C): a partial run, not evidence"


INTERRUPTED = "interrupted"


def verdict(
    cfg: LoadConfig, live: LiveStats, counts: dict[str, int], reasons: list[str], interrupted: bool = False
) -> int:
    """Print the run's one-line result (and an SLO failure) on stdout; return the exit status."""
    # Read from the histogram: at most 1 % high, on the SLO's side of it (the check is exact).
    # Labelled: "run" counts are the whole run's, warm-up included; "measured ok latency" is the
    # report's latency (successful requests after the warm-up, from the intended send time).
    p50, p99 = live.latency_ms(0.5), live.latency_ms(0.99)
    line = "VALID" if not reasons else "INVALID: " + "; ".join(reasons)
    gone = live.target_gone()
    print(
        f"netgain load: {counts['rows']} rows in {cfg.out}/{files.REQUESTS} | run: ok {counts['ok']} "
        f"errors {counts['errors']} dropped {counts['dropped']} | measured ok latency p50 {p50:.2f} ms "
        f"p99 {p99:.2f} ms | {line}" + (f" | {gone}" if gone else ""),
        flush=True,
    )
    if interrupted:
        print(
            f"netgain load: PARTIAL RUN (interrupted): {counts['rows']} rows and meta.json written",
            flush=True,
        )
        return EXIT_INTERRUPTED
    if reasons:
        return EXIT_INVALID
    # Failed measured requests exit 5 unless --max-error-rate says how many may fail (then 4); a
    # run in which none succeeded is a failed target whatever --max-error-rate allows.
    none_ok = live.measured > 0 and live.measured_ok == 0
    failed = live.measured_failures() if cfg.max_error_rate is None or none_ok else ""
    if failed:
        print(
            f"netgain load: REQUESTS FAILED: {gone or failed}" + ("; none succeeded" if none_ok else ""),
            flush=True,
        )
        return EXIT_FAILED
    # Exact, as the report's slo_held on the same rows.
    slo_fail = live.slo_failures(cfg.max_error_rate)
    if slo_fail:
        print("netgain load: SLO FAILED: " + "; ".join(slo_fail), flush=True)
        return EXIT_SLO
    return EXIT_OK
