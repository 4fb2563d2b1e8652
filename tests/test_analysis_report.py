"""build_report on synthetic run directories: every number against an independent computation."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from analysis_fixtures import make_run, span_log

from netgain.analysis import AnalysisError, build_report, write_outputs

DESIGN_KEYS = {
    "schema",
    "latency_ms",
    "throughput_rps",
    "errors",
    "send_lag_ms",
    "phases_ms",
    "tail",
    "gpu",
    "cpu",
    "cold_start_s",
    "cost_per_1k",
    "bottleneck",
    "valid",
    "warnings",
}


def _raw(run: Path) -> dict[str, np.ndarray]:
    t = pq.read_table(run / "requests.parquet").to_pydict()
    return {
        k: np.array([np.nan if v is None else v for v in vals], dtype=float)
        if k.endswith(("_ns", "_ms"))
        else np.array(vals)
        for k, vals in t.items()
    }


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q * 100, method="inverted_cdf"))


@pytest.fixture(scope="module")
def inflated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # kernel +40 ms on 2 % of requests; 3 errors and one deadline in the measured window
    return make_run(
        tmp_path_factory.mktemp("runs") / "inflated",
        rate=500.0,
        duration_s=12.0,
        warmup_s=2.0,
        inflate=("kernel", 0.02, 40.0),
        statuses={
            1500: "INVALID_ARGUMENT",
            1501: "INVALID_ARGUMENT",
            2000: "UNAVAILABLE",
            10: "INVALID_ARGUMENT",
        },
    )


def test_known_answers(inflated: Path) -> None:
    r = build_report(inflated, price_per_hour=1.8, slo_p99_ms=100.0, bootstrap=100, seed=3)
    assert set(r) >= DESIGN_KEYS and r["schema"] == 1
    raw = _raw(inflated)
    measured = ~raw["warmup"].astype(bool)
    ok = measured & (raw["status"] == "OK")
    lat = (raw["done_ns"] - raw["scheduled_ns"])[ok] / 1e6
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert r["latency_ms"][key] == pytest.approx(_pct(lat, q), abs=1e-9), key
    assert r["latency_ms"]["max"] == pytest.approx(lat.max())
    assert r["latency_ms"]["mean"] == pytest.approx(lat.mean())
    # 500/s over the 10 s measured window, 3 measured errors (row 10 is warm-up)
    assert r["counts"]["measured"] == 5000 and r["counts"]["ok"] == 4997 and r["counts"]["warmup"] == 1000
    # throughput: OK requests that finished inside [2 s, 12 s), whenever scheduled, per second
    done_s = raw["done_ns"].astype(float) / 1e9
    completed = (raw["status"] == "OK") & (done_s >= 2.0) & (done_s < 12.0)
    assert r["counts"]["completed_in_window"] == int(completed.sum())
    assert r["throughput_rps"] == pytest.approx(completed.sum() / 10.0)
    assert r["errors"] == {"INVALID_ARGUMENT": 2, "UNAVAILABLE": 1}
    assert r["statuses"]["OK"] == 4997
    assert r["error_rate"] == pytest.approx(3 / 5000)
    lo, hi = r["throughput_ci_rps"]
    assert lo <= r["throughput_rps"] <= hi
    lo, hi = r["latency_ci_ms"]["p99"]
    assert lo <= r["latency_ms"]["p99"] <= hi
    # send lag is 0.05 ms everywhere by construction
    assert r["send_lag_ms"]["p99"] == pytest.approx(0.05, abs=1e-6)
    # phases: exact stats of the stored columns over OK measured rows
    for p in ("queue", "pre", "kernel", "post"):
        v = raw[f"{p}_ms"][ok]
        assert r["phases_ms"][p]["p50"] == pytest.approx(_pct(v, 0.5))
        assert r["phases_ms"][p]["p99"] == pytest.approx(_pct(v, 0.99))
        assert r["phases_ms"][p]["mean"] == pytest.approx(v.mean())
    net = ((raw["done_ns"] - raw["sent_ns"]) / 1e6 - raw["server_total_ms"])[ok]
    assert r["phases_ms"]["network"]["mean"] == pytest.approx(net.mean())
    # tail: the inflated phase dominates at p99 and p99.9, overall and per batch size
    assert r["tail"]["dominant"] == "kernel"
    assert r["tail"]["p999"]["dominant"] == "kernel"
    assert r["tail"]["p99"]["phases"]["kernel"]["excess_ms"] == pytest.approx(40.0, rel=0.05)
    assert r["tail"]["p99"]["n"] == int((lat >= r["latency_ms"]["p99"]).sum())
    assert {v["dominant"] for v in r["tail"]["p99"]["by_batch_size"].values()} == {"kernel"}
    shares = r["tail"]["p99"]["phases"]
    assert sum(v["share"] for v in shares.values()) == pytest.approx(1.0, abs=1e-6)
    # cost: $1.8/h at the completions per second
    assert r["cost_per_1k"] == pytest.approx(1.8 / r["throughput_rps"] * 1000 / 3600)
    assert r["cold_start_s"] == 4.0
    assert r["valid"] is True and r["cost"]["slo_held"] is True


def test_slo_missed_means_no_cost_at_slo(inflated: Path) -> None:
    r = build_report(inflated, price_per_hour=1.8, slo_p99_ms=1.0, bootstrap=0)
    assert r["cost_per_1k"] is None and r["cost"]["slo_held"] is False
    assert "misses the SLO" in r["cost"]["note"]
    assert r["cost"]["cost_per_1k_measured"] == pytest.approx(1.8 / r["throughput_rps"] * 1000 / 3600)
    # capacity figures come only from runs that held the SLO: no replay from this one
    assert r["cost"]["autoscale"] is None and "missed the SLO" in r["cost"]["capacity_note"]


def test_no_success_with_a_price_and_an_slo_is_reported(tmp_path: Path) -> None:
    """Every request failed: no p99, so the SLO is not held and there is no cost at it; the note
    says why instead of formatting a missing p99."""
    every = dict.fromkeys(range(100), "INTERNAL")  # make_run writes rate x duration_s rows
    run = make_run(tmp_path / "failed", rate=50.0, duration_s=2.0, warmup_s=0.5, statuses=every)
    r = build_report(run, price_per_hour=1.8, slo_p99_ms=50.0, bootstrap=0)
    assert r["latency_ms"]["p99"] is None and r["cost_per_1k"] is None and r["cost"]["slo_held"] is None
    assert r["cost"]["note"] == (
        "no measured request succeeded: no p99 to hold the SLO 50 ms: no cost at SLO for this run"
    )


def test_prices_and_slo_default_from_meta(tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "m",
        rate=100.0,
        duration_s=5.0,
        warmup_s=1.0,
        meta={"config": {"price_per_hour": 0.36, "slo_p99_ms": 50.0}},
    )
    r = build_report(run, bootstrap=0)
    assert r["slo_p99_ms"] == 50.0 and r["cost_per_1k"] == pytest.approx(0.36 / 100.0 * 1000 / 3600)


def test_warmup_override(tmp_path: Path) -> None:
    run = make_run(tmp_path / "w", rate=100.0, duration_s=10.0, warmup_s=1.0)
    r = build_report(run, warmup_s=4.0, bootstrap=0)
    assert r["counts"]["measured"] == 600 and r["throughput_rps"] == pytest.approx(100.0)


def test_late_sends_make_run_invalid(tmp_path: Path) -> None:
    run = make_run(tmp_path / "late", rate=200.0, duration_s=5.0, warmup_s=1.0, late=(0.05, 30.0))
    r = build_report(run, bootstrap=0)
    assert r["valid"] is False and r["send_lag_ms"]["p99"] == pytest.approx(30.0)
    assert any("send lag" in w for w in r["warnings"])
    assert r["bottleneck"]["kind"] == "loadgen-bound"


def test_dropped_requests_make_run_invalid(tmp_path: Path) -> None:
    run = make_run(tmp_path / "drop", rate=200.0, duration_s=5.0, warmup_s=1.0, statuses={500: "DROPPED"})
    r = build_report(run, bootstrap=0)
    assert r["valid"] is False and r["counts"]["dropped"] == 1 and r["errors"] == {"DROPPED": 1}
    assert r["bottleneck"]["kind"] == "loadgen-bound"


def test_meta_validity_false_is_invalid(tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "v",
        rate=100.0,
        duration_s=3.0,
        warmup_s=1.0,
        meta={"validity": {"valid": False, "reasons": ["worker 1 lost"]}},
    )
    r = build_report(run, bootstrap=0)
    assert r["valid"] is False and r["invalid_reasons"] == ["worker 1 lost"]


def test_too_few_samples_warn(tmp_path: Path) -> None:
    run = make_run(tmp_path / "few", rate=50.0, duration_s=5.0, warmup_s=1.0)
    r = build_report(run, bootstrap=0)
    assert r["enough_samples"]["p99"]["enough"] is False and r["enough_samples"]["p99"]["n"] == 200
    assert any("cannot bound p99 " in w for w in r["warnings"])


def test_span_log_join_counts_unmatched(tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "s", rate=100.0, duration_s=3.0, warmup_s=1.0, statuses={150: "DEADLINE_EXCEEDED"}
    )
    log = span_log(tmp_path / "spans.jsonl", run, skip={5, 6, 7}, extra=2)
    r = build_report(run, span_log=log, bootstrap=0)
    j = r["join"]
    assert (j["spans"], j["matched_spans"], j["unmatched_spans"], j["unmatched_requests"]) == (299, 297, 2, 3)
    assert j["filled_from_span_log"] == 1  # the deadline-exceeded row had no trailer
    assert any("span log join" in w for w in r["warnings"])


def test_span_log_of_a_running_server_loses_only_its_unfinished_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "s", rate=100.0, duration_s=3.0, warmup_s=1.0)
    log = span_log(tmp_path / "spans.jsonl", run)
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"id":"span-9","code":"OK","ba')  # a line the server is still writing
    assert build_report(run, span_log=log, bootstrap=0)["join"]["spans"] == 300
    log.write_bytes(whole.rstrip(b"\n"))  # a finished last line without its newline still counts
    assert build_report(run, span_log=log, bootstrap=0)["join"]["spans"] == 300
    log.write_bytes(b'{"id":"span-0","co')  # the server's first line, half written
    assert build_report(run, span_log=log, bootstrap=0)["join"]["spans"] == 0
    log.write_bytes(b"hello")  # not a span log at all: refused, not read as empty
    with pytest.raises(AnalysisError, match="is not JSON lines"):
        build_report(run, span_log=log, bootstrap=0)


def test_write_outputs(inflated: Path, tmp_path: Path) -> None:
    r = build_report(inflated, bootstrap=10)
    paths = write_outputs(r, tmp_path)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    again = json.loads(paths[0].read_text())
    assert again["latency_ms"] == r["latency_ms"]
    html = paths[2].read_text()
    assert html.count("<svg") >= 6 and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "# netgain report" in paths[1].read_text()
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        ET.fromstring(svg)  # every inline plot is well-formed XML


def test_window_follows_netgain_load_meta(tmp_path: Path) -> None:
    # config.duration_s excludes the warm-up; trace.duration_s is only the last arrival
    run = make_run(tmp_path / "win", rate=100.0, duration_s=6.0, warmup_s=1.0)
    r = build_report(run, bootstrap=0)
    assert r["window_s"] == {"start": 1.0, "end": 6.0, "duration": 5.0}
    with pytest.raises(AnalysisError, match="no measured window"):
        build_report(run, warmup_s=6.0, bootstrap=0)
