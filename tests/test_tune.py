"""``netgain tune``: the rate search, the table and tune.json, and compare's use of the result."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import run_netgain

from netgain.cli.experiments import _tuned
from netgain.errors import NetgainError
from netgain.experiments.tune import Knobs, Result, Trial, best, grid, load_best, search


def trial(rate: float, held: bool) -> Trial:
    return Trial(rate, rate, 1.0, 50.0 if held else 500.0, 0, 0.0, True, "", held)


def test_search_doubles_until_a_miss_then_bisects() -> None:
    seen: list[float] = []

    def run(rate: float) -> Trial:
        seen.append(rate)
        return trial(rate, rate <= 300)

    trials = search(run, 50, 10_000, bisect_steps=3)
    assert seen == [50, 100, 200, 400, 300, 350, 325]
    assert max(t.throughput for t in trials if t.held) == 300


def test_search_that_misses_at_once_halves_the_start() -> None:
    trials = search(lambda r: trial(r, r <= 20), 50, 1000, bisect_steps=2)
    assert [t.rate for t in trials] == [50, 25, 12.5, 18.75, 21.875]
    assert [t.held for t in trials] == [False, False, True, True, False]


def test_best_is_the_highest_capacity_and_none_without_a_hold() -> None:
    a, b, c = Result(Knobs("0")), Result(Knobs("2")), Result(Knobs("4"))
    a.trials, b.trials, c.trials = (
        [trial(100, True)],
        [trial(100, True), trial(300, True)],
        [trial(50, False)],
    )
    assert best([a, b, c]) is b and b.capacity == 300 and c.capacity is None
    assert best([c]) is None


def test_tune_result_is_checked_when_read(tmp_path: Path) -> None:
    bad = tmp_path / "tune.json"
    bad.write_text(json.dumps({"schema": 99}))
    with pytest.raises(NetgainError, match="schema"):
        load_best(str(bad))
    bad.write_text(json.dumps({"schema": 1, "best": None}))
    with pytest.raises(NetgainError, match="no configuration held"):
        load_best(str(tmp_path))


@pytest.mark.slow
def test_tune_on_a_real_server_writes_the_table_and_compare_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    usable = sorted(os.sched_getaffinity(0))
    server, load = (str(usable[0]), str(usable[-1])) if len(usable) > 1 else ("all", "all")
    res = run_netgain(
        "tune", "--model", "null", "--workers-list", "0", "--batch-sizes", "4,8", "--start-rps", "20",
        "--max-rps", "80", "--bisect-steps", "0", "--duration", "1", "--warmup-s", "0.5",
        "--slo-p99-ms", "1000", "--out", str(out), "--server-cpus", server, "--load-cpus", load, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    if len(usable) > 1:  # each side on its own core, said once and recorded by both
        assert f"placement: server on cores {server}, load generator on cores {load}" in res.stderr
        assert f"cores {server})" in (out / "c0" / "server.log").read_text()
        metas = list(out.glob("c*/r*/meta.json"))
        assert metas and {json.loads(m.read_text())["host"]["client_cpus"] for m in metas} == {load}
    doc = json.loads((out / "tune.json").read_text())
    assert doc["schema"] == 1 and len(doc["configs"]) == 2
    caps = [c["capacity_rps"] for c in doc["configs"]]
    assert all(c is not None and c > 0 for c in caps), doc
    assert doc["best"]["capacity_rps"] == max(caps)
    assert "capacity/s" in res.stdout and "best: --workers 0" in res.stdout
    assert (out / "tune.md").read_text().startswith("# netgain tune")
    flags, batch = _tuned(str(out))
    assert batch in (4, 8) and "--max-batch-size" not in flags and flags[:2] == ["--workers", "0"]


def test_the_grid_tries_pre_processing_processes_only_beside_frontend_processes() -> None:
    knobs = grid(["0", "2"], [8], [2.0], [0], [2], ["auto", "3"])
    assert [(k.workers, k.pre_processes) for k in knobs] == [("0", "auto"), ("2", "auto"), ("2", "3")]
    flags = knobs[-1].serve_args()
    assert flags[flags.index("--pre-processes") + 1] == "3"


def test_a_trial_keeps_every_lever_its_report_named() -> None:
    from netgain.experiments.tune import trial as judged

    def rep(bottleneck: dict[str, Any]) -> dict[str, Any]:
        return {
            "latency_ms": {"p50": 10.0, "p99": 150.0}, "errors": {}, "error_rate": 0.0,
            "valid": True, "throughput_rps": 99.0, "bottleneck": bottleneck,
            "enough_samples": {"p99": {"n": 42}},
        }  # fmt: skip

    two = {
        "kind": "cpu-bound", "action": "add cores",
        "kinds": [
            {"kind": "cpu-bound", "action": "add cores"}, {"kind": "queue-full", "action": "more queue"},
        ],
    }  # fmt: skip
    t = judged(rep(two), 100.0, 100.0, 1e-3)
    assert not t.held and t.bottleneck == "cpu-bound"
    assert t.levers == (("cpu-bound", "add cores"), ("queue-full", "more queue"))
    assert t.samples == 42  # the successful requests its p99 rests on
    # A report naming one kind only still gives its action.
    assert judged(rep({"kind": "gpu-bound", "action": "a bigger GPU"}), 100.0, 100.0, 1e-3).levers == (
        ("gpu-bound", "a bigger GPU"),
    )
