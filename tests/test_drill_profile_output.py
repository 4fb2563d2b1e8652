"""What `netgain drill --scale-up` and `netgain profile` print on a CPU: the drill tells the failures it
causes from real ones in words, and the profile shows CPU operators (not zero kernels) and the
profiler's own cost, flagged when it shows in the latency."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_netgain as netgain

from netgain.experiments.profile import overhead_lines, profiler_overhead


@pytest.mark.slow
def test_scale_up_drill_names_its_own_failures_in_words(tmp_path: Path) -> None:
    """The requests the drill sends to replica 2 before it starts are said to be expected, not
    TARGET WENT AWAY, and no raw JSON summary is printed."""
    res = netgain(
        "drill", "--model", "null", "--repeats", "1", "--scale-up", "--rate", "20", "--duration", "6",
        "--delay-s", "1", "--out", str(tmp_path / "drill"), timeout=240.0,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    assert "TARGET WENT AWAY" not in res.stdout and "REQUESTS FAILED" not in res.stdout, res.stdout
    assert not any(line.lstrip().startswith(("{", "scale-up: {")) for line in res.stdout.splitlines())
    assert "expected, the drill sends to it before it starts" in res.stdout
    assert "scale-up: replica 2 spawned 1 s into the load: SERVING after" in res.stdout
    assert json.loads((tmp_path / "drill" / "drill.json").read_text())["scale_up"]["replica2_ok_requests"] > 0


@pytest.mark.slow
def test_profile_on_the_cpu_shows_operators_and_the_profilers_cost(tmp_path: Path) -> None:
    """On the CPU there are no device kernels or copies to report as 0.00 ms: the top operators are
    shown, and a line compares latency while profiling with the rest."""
    res = netgain(
        "profile", "--model", "tabular", "--serve-args", "--workers 0", "--rate", "20", "--duration", "8",
        "--batches", "10", "--out", str(tmp_path / "prof"), timeout=240.0,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    assert "kernels 0.00 ms" not in res.stdout and "copies 0.00 ms" not in res.stdout
    assert "on the CPU" in res.stdout and "aten::" in res.stdout
    assert "profiler overhead: server p99" in res.stdout.lower()


def _spans(path: Path, during_ms: float, other_ms: float, t0_ns: int) -> None:
    with open(path, "w") as fh:
        for i in range(200):
            arrival = t0_ns + i * 50_000_000  # 10 s of arrivals; the middle 2 s are "profiling"
            inside = 4_000_000_000 <= arrival - t0_ns <= 6_000_000_000
            total = during_ms if inside else other_ms
            fh.write(
                json.dumps({"id": f"r-{i}", "code": "OK", "arrival_unix_ns": arrival, "total_ms": total})
            )
            fh.write("\n")


def _run(path: Path, latency_ms: float) -> None:
    path.mkdir()
    n = 200
    pq.write_table(
        pa.table({
            "status": ["OK"] * n,
            "scheduled_ns": [i * 1_000_000 for i in range(n)],
            "done_ns": [i * 1_000_000 + int(latency_ms * 1e6) for i in range(n)],
        }),
        path / "requests.parquet",
    )  # fmt: skip


def test_profiler_overhead_is_flagged_only_when_it_shows(tmp_path: Path) -> None:
    """Server p99 while profiling 25x the rest (or the client's p99 far above the server's) is
    flagged in capitals with what to do; equal latencies are reported plainly."""
    t0 = 1_700_000_000 * 10**9
    window = (t0 / 1e9 + 4.0, t0 / 1e9 + 6.0)
    _spans(tmp_path / "slow.jsonl", 500.0, 20.0, t0)
    _run(tmp_path / "run", 20.5)
    o = profiler_overhead(str(tmp_path / "slow.jsonl"), window, str(tmp_path / "run"))
    assert o["inflated"] and o["ratio"] == pytest.approx(25.0)
    text = "\n".join(overhead_lines(o))
    assert text.strip().startswith("PROFILER OVERHEAD: server p99 500.00 ms") and "without profiling" in text
    _spans(tmp_path / "even.jsonl", 20.0, 20.0, t0)
    even = profiler_overhead(str(tmp_path / "even.jsonl"), window, str(tmp_path / "run"))
    assert not even["inflated"] and "profiler overhead:" in "\n".join(overhead_lines(even))
    _run(tmp_path / "slowclient", 559.0)  # the client saw 559 ms where the server took 20
    client = profiler_overhead(str(tmp_path / "even.jsonl"), window, str(tmp_path / "slowclient"))
    assert client["inflated"] and client["load_p99_ms"] == pytest.approx(559.0)
