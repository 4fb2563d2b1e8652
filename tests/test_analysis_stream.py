"""The streamed report (requests.parquet read in chunks, exact order statistics over a few passes)
against the in-memory one on the same run directories: every count, percentile, bootstrap draw and
attribution equal; means (sums over counts instead of numpy's pairwise means) equal to 1e-12."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analysis_fixtures import make_run

from netgain.analysis import stream, stream_reader
from netgain.analysis.run_summary import RunResult, analyze

MEANS = {"mean", "tail_mean_ms", "median_mean_ms", "excess_ms", "share", "latency_mean_ms"}
MEANS |= {"median_latency_mean_ms"}


def _same(a: Any, b: Any, path: str, approx: bool = False) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}", approx or k in MEANS)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]", approx)
    elif isinstance(a, float) and approx and b is not None:
        assert b == pytest.approx(a, rel=1e-12, abs=1e-12), path
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b and type(a) is type(b), f"{path}: {a!r} != {b!r}"


def _both(
    run: Path, monkeypatch: pytest.MonkeyPatch, budget: int = 40, **kw: Any
) -> tuple[RunResult, RunResult]:
    monkeypatch.setattr(stream, "STREAM_ABOVE_ROWS", 10**12)
    whole = analyze(run, **kw)
    # small chunks and, by default, a small budget: several chunks per pass and buckets counted
    # again; with a large one, pass 2 keeps every wanted bucket and sums the tail as it goes
    monkeypatch.setattr(stream, "STREAM_ABOVE_ROWS", 0)
    monkeypatch.setattr(stream_reader, "CHUNK_ROWS", 333)
    monkeypatch.setattr(stream, "SELECT_BUDGET", budget)
    streamed = analyze(run, **kw)
    return whole, streamed


def _check(whole: RunResult, streamed: RunResult) -> None:
    _same(whole.report, streamed.report, "report")
    assert np.array_equal(whole.p99_draws, streamed.p99_draws)
    assert np.array_equal(whole.thr_draws, streamed.thr_draws)


def test_streamed_report_equals_the_in_memory_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with errors, an inflated tail and two batch sizes reads the same both ways."""
    run = make_run(
        tmp_path / "r",
        rate=400.0,
        duration_s=8.0,
        inflate=("kernel", 0.02, 30.0),
        statuses={100: "INVALID_ARGUMENT", 900: "DEADLINE_EXCEEDED", 1700: "DROPPED", 2000: "NOT_SENT"},
        samples={"netgain_kernel_busy_ratio": 0.3},
        meta={"config": None},
    )
    whole, streamed = _both(run, monkeypatch, price_per_hour=2.0, slo_p99_ms=50.0, bootstrap=50, seed=3)
    assert whole.report["counts"]["rows"] == 3200
    _check(whole, streamed)


def _random_run(path: Path, n: int, seed: int) -> Path:
    """Heavy-tailed latencies with ties, missing trailers, negative ``other`` and a late warm-up."""
    rng = np.random.default_rng(seed)
    make_run(path, rate=n / 10.0, duration_s=10.0, warmup_s=1.0)
    t = pq.read_table(path / "requests.parquet")
    sched = np.sort(rng.uniform(0, 10e9, n)).astype(np.int64)
    lat_ns = (rng.lognormal(np.log(5e6), 0.8, n) // 1000 * 1000).astype(np.int64)  # µs ticks: ties
    sent = sched + rng.integers(0, 50_000, n)
    done = sched + lat_ns
    trailer = rng.random(n) > 0.05
    phases = {
        c: rng.exponential(1.0, n) for c in t.column_names if c.endswith("_ms") and c != "server_total_ms"
    }
    total = sum(phases.values()) - rng.exponential(0.1, n)
    status = np.where(rng.random(n) < 0.01, "UNAVAILABLE", "OK")
    cols = {
        "scheduled_ns": pa.array(sched),
        "sent_ns": pa.array(sent),
        "done_ns": pa.array(done),
        "status": pa.array(status.tolist()),
        "batch_size": pa.array(np.where(trailer, rng.integers(1, 5, n), 0).astype(np.int32), mask=~trailer),
        "server_total_ms": pa.array(total, mask=~trailer),
        **{c: pa.array(v, mask=~trailer) for c, v in phases.items()},
    }
    for name, arr in cols.items():
        t = t.set_column(t.column_names.index(name), name, arr)
    pq.write_table(t, path / "requests.parquet", row_group_size=1000)
    return path


@pytest.mark.parametrize("warmup_s", [None, 2.5])
@pytest.mark.parametrize("budget", [40, 4_000_000])
def test_streamed_equals_in_memory_on_heavy_tails_and_ties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warmup_s: float | None, budget: int
) -> None:
    """Ties, NaN phases, negative values and a --warmup-s override: still the same figures."""
    run = _random_run(tmp_path / "r", 6000, seed=7)
    whole, streamed = _both(run, monkeypatch, budget, warmup_s=warmup_s, bootstrap=200)
    assert whole.report["tail"]["p99"]["n"] > 0
    _check(whole, streamed)


def test_streamed_run_without_any_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No successful request: no latency, no tail, the same warnings."""
    run = make_run(
        tmp_path / "r",
        rate=50.0,
        duration_s=4.0,
        warmup_s=1.0,
        statuses=dict.fromkeys(range(200), "UNAVAILABLE"),
    )
    whole, streamed = _both(run, monkeypatch, bootstrap=20)
    assert whole.report["latency_ms"]["p99"] is None
    _check(whole, streamed)


def test_large_runs_stream_and_span_logs_do_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the row threshold the report streams; a span log to join keeps the rows in memory."""
    run = make_run(tmp_path / "r", rate=100.0, duration_s=3.0, warmup_s=1.0)
    monkeypatch.setattr(stream, "STREAM_ABOVE_ROWS", 299)
    assert stream.streams(run, None)
    assert not stream.streams(run, tmp_path / "spans.jsonl")
    monkeypatch.setattr(stream, "STREAM_ABOVE_ROWS", 300)
    assert not stream.streams(run, None)


def test_an_interrupted_run_is_cut_at_its_interrupt_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C at 6.5 s of a 10 s schedule: the requests in flight CANCELLED, the rest NOT_SENT. The
    streamed report measures up to the interrupt as the in-memory one does: the same counts (the
    cut-off rows are neither measured nor failures), window, percentiles and draws."""
    rate, cut = 300.0, 6.5
    first_unsent = int(cut * rate)
    statuses = {i: "CANCELLED" for i in range(first_unsent - 12, first_unsent)}
    statuses |= {i: "NOT_SENT" for i in range(first_unsent, int(10 * rate))}
    statuses[300 * 4] = "UNAVAILABLE"
    meta = {
        "interrupted_at_s": cut,
        "validity": {"valid": False, "reasons": [f"interrupted at {cut} s (Ctrl-C)"]},
    }
    run = make_run(tmp_path / "r", rate=rate, duration_s=10.0, statuses=statuses, meta=meta)
    whole, streamed = _both(run, monkeypatch, price_per_hour=2.0, slo_p99_ms=50.0, bootstrap=50, seed=5)
    assert whole.report["interrupted"] is True
    assert whole.report["window_s"]["end"] == pytest.approx(cut)
    measured = whole.report["counts"]
    assert "NOT_SENT" not in (measured.get("statuses") or {}), measured
    _check(whole, streamed)
