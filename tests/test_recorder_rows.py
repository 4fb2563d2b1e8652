"""The recorder's histogram rows: a frontend's (every phase in each request's row) and the one-process
server's (total, queue, post) export exactly what the histograms fed the same values directly export."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from netgain.contract.phases import PHASES
from netgain.protos import pb
from netgain.server.batching.queue import Pending
from netgain.server.telemetry.histograms import ALL, PER_REQUEST, SERIES, DurationHistograms
from netgain.server.telemetry.metrics import DURATION_BUCKETS, ServerMetrics
from netgain.server.telemetry.recorder import Recorder

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _samples(collector: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, object]]:
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): (
            s.value,
            None if s.exemplar is None else (s.exemplar.labels, s.exemplar.value),  # not its timestamp
        )
        for family in registry.collect()
        for s in family.samples
    }


def _requests() -> list[tuple[Pending, int]]:
    """Requests in several buckets; one missing phases, one traced, one failed, one id too long."""
    out = []
    for i in range(60):
        rid = "r" * 128 if i == 11 else f"r{i}"
        p = Pending(rid, [pb.Input(data=b"x")], 0)
        p.spans = {phase: (i % 9 + 1) * 10 ** (3 + k % 4) * (k + 1) + i for k, phase in enumerate(PHASES)}
        if i == 3:
            del p.spans["h2d"], p.spans["d2h"]  # never reached: counted 0
        if i == 59:  # the last: its bucket's exemplar
            p.traceparent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
        if i == 7:
            p.code = "INTERNAL"
        out.append((p, 10**4 * (i + 1) ** 2))
    return out


@pytest.mark.parametrize("per_request_phases", [True, False])
def test_recorder_rows_export_what_direct_observations_export(per_request_phases: bool) -> None:
    metrics = ServerMetrics(CollectorRegistry(), "null", "cpu")
    rec = Recorder(metrics, None, interval_s=3600, per_request_phases=per_request_phases)
    direct = DurationHistograms(metrics.labels, DURATION_BUCKETS)
    series = ALL if per_request_phases else PER_REQUEST
    rows, ids, trace_ids = [], [], []
    for p, total in _requests():
        rec.request_done(p, total)
        if p.code != "OK":
            continue
        values = {"total": total, **{k: p.spans.get(k, 0) for k in PHASES}}
        rows.append([values[SERIES[s]] / 1e9 for s in series])
        ids.append(p.request_id)
        trace_ids.append(TRACE_ID if p.traceparent else "")
    rec.start()
    rec.stop()  # drains what is left
    direct.add(np.array(rows), ids, series, trace_ids)
    got, want = _samples(metrics.durations), _samples(direct)
    assert got.keys() == want.keys()
    for key, (value, exemplar) in want.items():
        assert got[key][0] == pytest.approx(value, rel=1e-12), key
        assert got[key][1] == exemplar, key
    assert any(e is not None and e[0].get("trace_id") == TRACE_ID for _, e in got.values())
    ok = metrics.requests_with("OK")._value.get()  # type: ignore[attr-defined]
    assert ok == 59 and metrics.requests_with("INTERNAL")._value.get() == 1  # type: ignore[attr-defined]


def test_exemplar_is_the_latest_request_of_its_bucket_whose_id_fits() -> None:
    hist = DurationHistograms({"model": "m"}, DURATION_BUCKETS)
    too_long = "L" * 119  # one over what an exemplar holds beside its label name
    seconds = np.array([[0.0011], [0.0012], [0.011], [0.11], [0.12]])  # three buckets of the total
    hist.add(seconds, ["a", too_long, too_long, "b", "c"], (0,))
    exemplars = {e.labels["request_id"]: e.value for e in hist.exemplars if e is not None}
    assert exemplars == {"a": 0.0011, "c": 0.12}  # the 10 ms bucket's only id does not fit: none
