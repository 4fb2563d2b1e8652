"""Each public trace format, imported by `netgain trace import --format` and replayed whole by `netgain
load --trace` against one real `netgain serve --model null` process on 127.0.0.1: every row of the
trace is one request with a record, answered, carrying the trace's payload size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import read_meta, read_rows
from conftest import run_netgain as netgain

from netgain.loadgen.payloads import size_bucket
from netgain.loadgen.traces import read_trace

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent / "data" / "traces"
SAMPLES = {
    "azure-llm-2023": "azure_llm_2023_code.csv",
    "azure-llm-2024": "azure_llm_2024_code.csv",
    "azure-functions-2019": "azure_functions_2019_d01.csv",
    "mooncake": "mooncake_conversation.jsonl",
    "burstgpt": "burstgpt_1.csv",
}
RATE = 25.0  # requests/s: the time-scaled samples last 1 to 4 s
NULL_DEFAULT_BYTES = 64  # the null model's payload when the size is 0 (netgain.contract.payloads)


@pytest.fixture(scope="module")
def null_server(start_server_module: Any) -> Any:
    return start_server_module("--model", "null", "--workers", "0", "--max-batch-size", "16")


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_imported_public_trace_replays_whole(null_server: Any, tmp_path: Path, fmt: str) -> None:
    trace_file = tmp_path / "trace.csv"
    imp = netgain("trace", "import", str(DATA / SAMPLES[fmt]), "--format", fmt, "--out", str(trace_file))
    assert imp.returncode == 0, imp.stderr
    trace = read_trace(trace_file)
    assert f"wrote {trace_file}: {len(trace)} requests" in imp.stdout
    out = tmp_path / "run"
    res = netgain(
        "load", "--target", null_server.target, "--trace", str(trace_file), "--rate", str(RATE),
        "--warmup-s", "0", "--out", str(out), "--quiet", "--max-send-lag-ms", "1000",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"({len(trace)} requests over" in res.stderr and f"to {RATE:g} req/s" in res.stderr
    meta, rows = read_meta(out), read_rows(out)
    n = len(trace)
    assert meta["trace"]["requests"] == meta["counts"]["scheduled"] == n
    assert sorted(rows["index"].tolist()) == list(range(n))  # one record per row of the trace
    assert (rows["status"] == "OK").all() and meta["counts"]["ok"] == n
    # Time-scaled whole: the schedule keeps the trace's order and relative gaps.
    order = np.argsort(rows["index"])
    scheduled = (rows["scheduled_ns"][order] - rows["scheduled_ns"][order][0]) / 1e9
    scale = (n / RATE) / trace.duration_s
    np.testing.assert_allclose(scheduled, trace.t_s * scale, rtol=0, atol=1e-6)
    # The payload on the wire is the trace's size (bucketed to two digits), plus protobuf framing.
    payload = np.array([size_bucket(int(s)) or NULL_DEFAULT_BYTES for s in trace.size])
    sent = rows["request_bytes"][order]
    assert ((sent >= payload) & (sent <= payload + 10)).all(), (sent - payload).tolist()
