"""Every number in report.json against a known answer.

One comparison (treatment with a span log and a rate sweep, baseline with its own sweep) is
built from synthetic run directories. The expected report is written out independently: hand
constants where the fixture fixes the answer (sample series, counts, the autoscaling replay,
prices), numpy on the raw Parquet rows elsewhere (analysis_reference.py: percentiles, means, tail
attribution). The walk at the end fails on any number in report.json that has no expected value,
so a new key cannot go unchecked. Bootstrap intervals are random: here they must bracket their estimate;
``test_confidence_intervals_degenerate`` pins them exactly where the answer is known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_fixtures import make_run, span_log
from analysis_reference import (
    BOOT,
    DURATION,
    PRICE_B,
    PRICE_T,
    RATE,
    SLO,
    WARMUP,
    autoscale,
    bracket,
    check_numbers,
    others,
    raw_rows,
    section,
    sweep_point,
)

from netgain.analysis import build_report
from netgain.analysis.report import to_json

# Samples are written at t = 0, 1, ..., 6 s; the measured window is [1, 6], so every mean below
# is over t = 1..6 (mean t = 3.5) and the t = 0 sample (inside the warm-up) must be ignored.
SAMPLES: dict[str, Any] = {
    "netgain_gpu_utilization_ratio": {"gpu=0": lambda t: 0.1 * t, "gpu=1": 0.25},  # 0.35, 0.25
    "netgain_gpu_sm_active_ratio": {"gpu=0": lambda t: 0.05 * t, "gpu=1": 0.125},  # 0.175, 0.125
    "netgain_kernel_busy_ratio": 0.3,
    "netgain_gpu_memory_used_bytes": {
        "gpu=0": lambda t: 1e9 + 1e8 * t,  # max 1.6e9 at t = 6
        "gpu=1": lambda t: 9e9 if t == 0 else 3e9,  # the warm-up peak does not count
    },
    "netgain_gpu_memory_total_bytes": {"gpu=0": 8e9, "gpu=1": 8e9},
    "netgain_gpu_power_watts": {"gpu=0": lambda t: 100.0 + 10.0 * t, "gpu=1": 55.0},  # 135, 55
    "netgain_cpu_cores": 16,
    "netgain_process_cpu_ratio": lambda t: 2.0 + 0.5 * t,  # 3.75
    "netgain_thread_cpu_ratio": {
        "role=prepost,thread=a": 0.6,
        "role=prepost,thread=b": 0.8,
        "role=frontend": 0.3,
        "role=compute": 4.0,
    },
    "netgain_client_worker_cpu_ratio": {"worker=0": 0.2, "worker=1": lambda t: 0.1 * t},  # 0.2, 0.35
    "netgain_queue_depth_requests": lambda t: 3.0 + 2.0 * t,  # mean 10, max 15, slope 2/s
}
GPU_EXPECTED = {
    "present": True,
    "utilization_mean": (0.35 + 0.25) / 2,
    "sm_active_mean": (0.175 + 0.125) / 2,
    "kernel_busy_mean": 0.3,
    "memory_used_max_bytes": 3e9,
    "memory_total_bytes": 8e9,
    "power_mean_watts": (135.0 + 55.0) / 2,
    "name": "NVIDIA H200",
}
CPU_EXPECTED = {
    "cores": 16.0,
    "process_mean": 3.75,
    "by_role": {"compute": 4.0, "frontend": 0.3, "prepost": 1.4},
    # prepost: 1.4 cores over pre_threads 2 x instances 1; frontend is one thread
    "per_thread": {"prepost": 0.7, "frontend": 0.3},
    # interpreter-bound roles summed: prepost 1.4 + frontend 0.3; the span log has no pid, so the
    # sum stands for one process (approximate)
    "interpreter": {
        "roles": ["frontend", "prepost"],
        "sum": 1.7,
        "processes": None,
        "busiest_share": None,
        "per_process": 1.7,
        "approximate": True,
        "method": "sum over the server's processes (the span log's pid was not available: "
        "a --workers server is judged approximately)",
    },
    "worker_max": 0.35,
}
# least-squares slope of 3 + 2t is 2/s; over the 5 s window the fit rises 10 >= QUEUE_RISE 8
QUEUE_EXPECTED = {
    "mean": 10.0,
    "max": 15.0,
    "slope_per_s": 2.0,
    "rise": 10.0,
    "in_flight": {"mean": None, "max": None, "slope_per_s": None, "rise": None},
    "max_queue_size": 256,
    "pressure": True,
}
STATUSES = {100: "INVALID_ARGUMENT", 300: "DEADLINE_EXCEEDED", 700: "UNAVAILABLE"}  # row 100 is warm-up


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("keys")
    common = {"rate": RATE, "duration_s": DURATION, "warmup_s": WARMUP}
    treat = make_run(
        root / "treat",
        device="cuda",
        inflate=("kernel", 0.02, 30.0),
        statuses=STATUSES,
        samples=SAMPLES,
        **common,
    )
    base = make_run(root / "base", device="cpu", phases_ms={"kernel": 9.0}, seed=1, **common)
    # capacity sweep of the treatment: 150/s meets the SLO, 300/s (80 ms queue) does not
    s150 = make_run(root / "s150", rate=150.0, duration_s=4.0, warmup_s=1.0, device="cuda", batch_sizes=(8,))
    s300 = make_run(
        root / "s300",
        rate=300.0,
        duration_s=4.0,
        warmup_s=1.0,
        device="cuda",
        batch_sizes=(4,),
        phases_ms={"queue": 80.0},
    )
    log = span_log(root / "spans.jsonl", treat, skip={5, 400}, extra=2)
    with log.open("a") as fh:  # one span twice
        fh.write(json.dumps({"id": "r00000010", "code": "OK", "total_ms": 9.0}) + "\n")
    report = build_report(
        treat,
        baseline_dir=base,
        price_per_hour=PRICE_T,
        baseline_price_per_hour=PRICE_B,
        slo_p99_ms=SLO,
        span_log=log,
        sweep_dirs=[s150, s300],
        baseline_sweep_dirs=[base],
        bootstrap=BOOT,
        seed=5,
    )
    return {"report": json.loads(to_json(report)), "treat": treat, "base": base, "s150": s150, "s300": s300}


def _expected(full: dict[str, Any]) -> dict[str, Any]:
    treat, base = full["treat"], full["base"]
    # treatment: 200/s for 6 s on replicas of 150/s -> 2 wanted from t = 0; the second is ready
    # after the 4 s cold start, so t = 0..3 run 50/s over capacity
    auto_t = autoscale(PRICE_T, 150.0, [2] * 6, [1, 1, 1, 1, 2, 2], [200.0] * 6)
    # baseline: 200/s on replicas of 200/s (its own sweep) -> one replica, never short
    auto_b = autoscale(PRICE_B, 200.0, [1] * 6, [1] * 6, [200.0] * 6)
    t = section(
        treat, price=PRICE_T, auto=auto_t, device="cuda", errors={"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 1}
    )
    b = section(base, price=PRICE_B, auto=auto_b, device="cpu", errors={})
    t.update(gpu=GPU_EXPECTED, cpu=CPU_EXPECTED, queue=QUEUE_EXPECTED)
    b.update(
        gpu={"present": False, "name": None},
        cpu={"by_role": {}, "per_thread": {}},
        queue={"max_queue_size": 256, "pressure": False, "in_flight": {}},
    )
    # spans: 1200 rows - 2 skipped + 2 ghosts + 1 duplicate; rows 100, 300, 700 (errors, no
    # trailer) are filled from the span log; rows 5 and 400 were sent but have no span
    t["join"] = {
        "spans": 1201,
        "matched_spans": 1199,
        "unmatched_spans": 2,
        "duplicate_spans": 1,
        "unmatched_requests": 2,
        "filled_from_span_log": 3,
    }
    b_raw = raw_rows(base)
    b_ok = ~b_raw["warmup"].astype(bool)
    b["sweep"] = {
        "capacity_rps": 200.0,
        "runs": 1,
        "runs_meeting_slo": 1,
        "slo_p99_ms": SLO,
        "points": [sweep_point(base, RATE, float(b_raw["batch_size"][b_ok].mean()), "cpu")],
    }
    top = dict(t)
    top["slo_p99_ms"] = SLO
    top["sweep"] = {
        "capacity_rps": 150.0,
        "runs": 2,
        "runs_meeting_slo": 1,
        "slo_p99_ms": SLO,
        "points": [
            sweep_point(full["s150"], 150.0, 8.0, "cuda"),
            sweep_point(full["s300"], 300.0, 4.0, "cuda"),
        ],
    }
    cpk_t, cpk_b = auto_t["cost_per_1k"], auto_b["cost_per_1k"]
    top["ratios"] = {
        "p99": {"value": t["latency_ms"]["p99"] / b["latency_ms"]["p99"]},
        "p50": {"value": t["latency_ms"]["p50"] / b["latency_ms"]["p50"]},
        "throughput": {"value": t["throughput_rps"] / b["throughput_rps"]},
        "cost_per_1k": {"value": (PRICE_T / t["throughput_rps"]) / (PRICE_B / b["throughput_rps"])},
        # same trace, same requests: the ratio of instance-seconds x price, 2 x 6 x 3 / (1 x 6 x 1)
        "cost_per_1k_autoscaled": {"value": 6.0},
    }
    assert cpk_t / cpk_b == pytest.approx(6.0)
    top["verdict"] = {
        # the SLO (50 ms) is above the baseline p99 and its interval's upper end
        "allowed_p99_ms": SLO,
        "cost_per_1k_baseline": cpk_b,
        "cost_per_1k_treatment": cpk_t,
        "cost_ratio": 6.0,
        # both capacities come from sweeps
        "capacity_rps": {"baseline": 200.0, "treatment": 150.0},
    }
    top["baseline"], top["treatment"] = b, t
    return top


def test_every_number_has_a_known_answer(full: dict[str, Any]) -> None:
    r = full["report"]
    want = _expected(full)
    ci_paths = (
        ".latency_ci_ms.p99",
        ".throughput_ci_rps",
        ".ratios.p99.ci",
        ".ratios.throughput.ci",
        ".ratios.cost_per_1k.ci",
        ".verdict.cost_ratio_ci",
    )
    skip = (
        *ci_paths,
        *(f".{side}{p}" for side in ("baseline", "treatment") for p in ci_paths),
        ".series",
        ".baseline.series",
        ".treatment.series",
    )
    checked = check_numbers(r, want, "", skip)
    assert len(checked) > 900  # the walk really covered the report
    # the skipped numbers: intervals bracket their estimate, series are checked below
    for side in (r, r["baseline"], r["treatment"]):
        bracket(side["latency_ci_ms"]["p99"], side["latency_ms"]["p99"])
        bracket(side["throughput_ci_rps"], side["throughput_rps"])
    for name in ("p99", "throughput", "cost_per_1k"):
        bracket(r["ratios"][name]["ci"], r["ratios"][name]["value"])
    # capacities from sweeps: the steady ratio's relative interval around the priced ratio
    steady = r["ratios"]["cost_per_1k"]
    assert r["verdict"]["cost_ratio_ci"] == pytest.approx([6.0 * c / steady["value"] for c in steady["ci"]])
    # both capacities come from sweeps (given, no draws): no interval for the autoscaled ratio
    assert r["ratios"]["p50"]["ci"] is None and r["ratios"]["cost_per_1k_autoscaled"]["ci"] is None


def test_every_string_and_flag_too(full: dict[str, Any]) -> None:
    r = full["report"]
    want = _expected(full)
    got = others(r)
    for path, v in others(want).items():
        assert got[path] == v, path
    assert r["valid"] is True and r["comparison"] is True and r["verdict"]["net_gain"] is False
    assert r["sweep"]["from_run"] == str(full["s150"]) and r["baseline"]["sweep"]["from_run"] == str(
        full["base"]
    )
    assert r["bottleneck"] == r["treatment"]["bottleneck"]
    # the queue rises 10 over the window while the GPU idles (0.35) and the interpreter-bound
    # roles use 1.7 cores: upstream-bound by the interpreter, never "unsaturated"
    srv_ev = [
        "queue depth mean 10.00, rise over window 10.00; in flight mean n/a, rise n/a "
        "(backlog: yes, rise >= 8)",
        "device cuda: GPU utilization mean 0.30, SM active 0.15, kernel busy 0.30 (busy >= 0.85, idle < 0.5)",
        "CPU per thread: prepost 0.70, frontend 0.30 core (saturated >= 0.9); process 3.75 of 16.00 cores",
        "interpreter: frontend+prepost 1.70 core per process (saturated >= 0.8: threads that need the "
        "GIL saturate together near one core); sum over the server's processes (the span log's pid "
        "was not available: a --workers server is judged approximately)",
        "saturated while the device idles: interpreter",
    ]
    action = (
        "more processes (netgain serve --workers N: one interpreter each), or take the work out of "
        "Python (GPU pre-processing with --handler-option decode=gpu, a faster decoder)"
    )
    assert r["bottleneck"] == {
        "kind": "upstream-bound",
        "resource": "interpreter",
        "action": action,
        "evidence": [
            "send lag p99 0.05 ms vs limit 5 ms",
            "dropped requests 0",
            "load worker CPU max 0.35 core (saturated at 0.9)",
            *srv_ev,
        ],
        "kinds": [
            {"kind": "upstream-bound", "resource": "interpreter", "action": action, "evidence": srv_ev}
        ],
        "drops_caused_by": None,
        "approximate": True,
    }
    assert r["baseline"]["bottleneck"]["kind"] == "unsaturated"
    assert r["baseline"]["bottleneck"]["evidence"][2:4] == [
        "load worker CPU max n/a core (saturated at 0.9)",
        "queue depth mean n/a, rise over window n/a; in flight mean n/a, rise n/a (backlog: no, rise >= 8)",
    ]


def test_series_points_are_the_samples_and_the_sorted_latencies(full: dict[str, Any]) -> None:
    r = full["report"]
    raw = raw_rows(full["treat"])
    ok = ~raw["warmup"].astype(bool) & (raw["status"] == "OK")
    lat = np.sort((raw["done_ns"] - raw["scheduled_ns"])[ok] / 1e6)
    cdf = r["series"]["latency_cdf"]
    assert (
        len(cdf) == 300
        and cdf[0] == pytest.approx([1 / len(lat), lat[0]])
        and cdf[-1] == pytest.approx([1.0, lat[-1]])
    )
    for p, v in cdf:
        i = round(p * len(lat)) - 1
        assert v == pytest.approx(lat[i])
    util = r["series"]["utilization"]
    plotted = {
        "gpu_utilization_ratio": "netgain_gpu_utilization_ratio",
        "gpu_sm_active_ratio": "netgain_gpu_sm_active_ratio",
        "kernel_busy_ratio": "netgain_kernel_busy_ratio",
        "process_cpu_ratio": "netgain_process_cpu_ratio",
        "queue_depth_requests": "netgain_queue_depth_requests",
        "thread_cpu_ratio[prepost]": "netgain_thread_cpu_ratio",
        "thread_cpu_ratio[frontend]": "netgain_thread_cpu_ratio",
        "thread_cpu_ratio[compute]": "netgain_thread_cpu_ratio",
    }
    assert set(util) == set(plotted)
    for name, metric in plotted.items():
        spec = SAMPLES[metric]
        series = spec if isinstance(spec, dict) else {"": spec}
        if name.startswith("thread_cpu_ratio["):
            role = name[len("thread_cpu_ratio[") : -1]
            series = {k: v for k, v in series.items() if f"role={role}" in k}
        want = sorted(
            (t, float(f(t) if callable(f) else f))
            for f in series.values()
            for t in np.arange(WARMUP, DURATION + 0.5)
        )
        got = sorted(map(tuple, util[name]))
        # pytest.approx compares flat sequences only (9.2 rejects nested ones): pair by pair
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            assert g == pytest.approx(w), name
    assert r["treatment"]["series"] == r["series"]
    assert r["baseline"]["series"]["utilization"] == {}


def test_confidence_intervals_degenerate(tmp_path: Path) -> None:
    """No noise, no errors: every bootstrap draw is the estimate, so every interval is [x, x]."""
    common = {"rate": 100.0, "duration_s": 5.0, "warmup_s": 1.0, "noise": 0.0}
    t = make_run(tmp_path / "t", device="cuda", phases_ms={"kernel": 1.0}, **common)
    b = make_run(tmp_path / "b", device="cpu", **common)
    r = build_report(
        t, baseline_dir=b, price_per_hour=2.0, baseline_price_per_hour=0.5, slo_p99_ms=50.0, bootstrap=30
    )
    # latency = 0.05 lag + 0.3 network + phases (1 + 2 + 1 + 0.5 on the treatment, 1 + 2 + 5 + 0.5 base)
    lt, lb = 0.05 + 0.3 + 4.5, 0.05 + 0.3 + 8.5
    assert r["latency_ms"]["p99"] == pytest.approx(lt, abs=1e-6) and r["baseline"]["latency_ms"][
        "p99"
    ] == pytest.approx(lb, abs=1e-6)
    assert r["latency_ci_ms"]["p99"] == pytest.approx([lt, lt], abs=1e-6)
    assert r["baseline"]["latency_ci_ms"]["p99"] == pytest.approx([lb, lb], abs=1e-6)
    assert r["throughput_ci_rps"] == pytest.approx([100.0, 100.0])
    assert r["ratios"]["p99"]["ci"] == pytest.approx([lt / lb, lt / lb], rel=1e-6)
    assert r["ratios"]["p50"]["value"] == pytest.approx(lt / lb, rel=1e-6)
    assert r["ratios"]["throughput"]["ci"] == pytest.approx([1.0, 1.0])
    assert r["ratios"]["cost_per_1k"]["ci"] == pytest.approx([4.0, 4.0])
    # each side carries its own traffic on one replica (capacity = its 100/s): 5 s x price
    assert r["ratios"]["cost_per_1k_autoscaled"]["value"] == pytest.approx(4.0)
    assert r["ratios"]["cost_per_1k_autoscaled"]["ci"] == pytest.approx([4.0, 4.0])
    assert r["cost"]["autoscale"]["cost_per_1k"] == pytest.approx(2.0 * 5 / 3600 / 500 * 1000)
