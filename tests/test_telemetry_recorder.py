"""The recorder off the request path: span-log lines, their file's rotation, and the histograms and
exemplars it feeds."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from netgain.contract.phases import PHASES
from netgain.protos import pb
from netgain.server.batching.queue import Pending
from netgain.server.telemetry.recorder import SpanLog, span_line


def pending(rid: str, items: int = 1, arrival_ns: int = 0) -> Pending:
    return Pending(rid, [pb.Input(data=b"x") for _ in range(items)], arrival_ns)


def test_span_log_rotates(tmp_path: Any) -> None:
    path = tmp_path / "spans.jsonl"
    log = SpanLog(str(path), max_bytes=100)
    log.write(["a" * 60 + "\n"])
    log.write(["b" * 60 + "\n"])  # would pass 100 bytes: the first line moves to .1
    log.close()
    assert path.read_text() == "b" * 60 + "\n"
    assert (tmp_path / "spans.jsonl.1").read_text() == "a" * 60 + "\n"


def test_span_line_fields() -> None:
    p = pending("req-1", items=2, arrival_ns=5)
    p.batch_id, p.batch_size = 7, 4
    p.spans = {"queue": 1_500_000, "kernel": 2_000_000, "post": 1}
    rec = json.loads(span_line(p, 4_000_000, 1_700_000_000_000_000_000, 42))
    assert rec["id"] == "req-1" and rec["code"] == "OK" and rec["items"] == 2 and rec["pid"] == 42
    assert (rec["batch_id"], rec["batch_size"], rec["total_ms"]) == (7, 4, 4.0)
    assert rec["queue_ms"] == 1.5 and rec["kernel_ms"] == 2.0 and rec["pre_ms"] == 0.0
    assert rec["post_ms"] == 0.000001 and rec["arrival_unix_ns"] == 1_700_000_000_000_000_000
    assert {f"{ph}_ms" for ph in PHASES} <= set(rec)


def test_span_line_keeps_every_nanosecond_and_escapes_the_id() -> None:
    """Milliseconds with six decimals are whole nanoseconds: written exactly, as round(ns / 1e6, 6)
    reads; a request id a client chose is JSON-escaped."""
    rng = random.Random(7)
    p = pending('id "quoted" \\ \n é')
    p.batch_id = -1  # failed before batching
    for _ in range(2000):
        p.spans = {ph: rng.randrange(0, 10**12) for ph in PHASES}
        total = rng.randrange(0, 10**13)
        rec = json.loads(span_line(p, total, 0, 1))
        assert rec["id"] == p.request_id and rec["batch_id"] == -1
        assert rec["total_ms"] == round(total / 1e6, 6)
        assert all(rec[f"{ph}_ms"] == round(p.spans[ph] / 1e6, 6) for ph in PHASES)


def test_recorder_observes_with_exemplars_and_writes_span_log(tmp_path: Any) -> None:
    import json

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from netgain.server.telemetry.metrics import ServerMetrics
    from netgain.server.telemetry.recorder import Recorder

    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, "null", "cpu")
    path = tmp_path / "spans.jsonl"
    rec = Recorder(metrics, SpanLog(str(path)), wall_offset_ns=0)
    long_id = "r" * 128  # the longest id the servicer accepts
    # Totals in different buckets: a bucket keeps only its latest exemplar.
    batch = []
    for rid, code, total in (
        ("short", "OK", 6_000),
        (long_id, "OK", 60_000_000),
        ("bad", "INVALID_ARGUMENT", 1),
    ):
        p = pending(rid)
        p.code = code
        p.spans = {phase: 1_000 for phase in PHASES}
        rec.request_done(p, total)
        batch.append(p)
    rec.batch_done(2, 5_000, batch)
    rec.start()
    rec.stop()  # drains what is left, closes the span log
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["short", long_id, "bad"]
    assert (
        registry.get_sample_value("netgain_requests_total", {"model": "null", "device": "cpu", "code": "OK"})
        == 2
    )
    assert (
        registry.get_sample_value(
            "netgain_phase_duration_seconds_count", {"model": "null", "device": "cpu", "phase": "kernel"}
        )
        == 2
    )
    assert registry.get_sample_value(
        "netgain_phase_duration_seconds_sum", {"model": "null", "device": "cpu", "phase": "kernel"}
    ) == pytest.approx(2e-6)
    assert registry.get_sample_value("netgain_batches_total", {"model": "null", "device": "cpu"}) == 1
    assert rec.kernel_ns_total == 5_000
    exposition = generate_openmetrics(registry).decode()
    assert 'request_id="short"' in exposition
    # An id too long for an OpenMetrics exemplar is not cut (a cut id names no request): no exemplar.
    assert long_id[:100] not in exposition
    assert "request_id" not in generate_latest(registry).decode()
