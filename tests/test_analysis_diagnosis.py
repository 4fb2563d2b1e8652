"""The diagnosis of runs that missed their SLO, shed requests or shared their host: never
`unsaturated`, the resource nearest saturation named with its figure, the same kind for the same
evidence across a sweep, and host contention as evidence or as the kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis_fixtures import make_run

from netgain.analysis import build_report

MISSED = {"config": {"slo_p99_ms": 5.0}}  # the fixture's requests take ~9 ms: p99 misses 5 ms
HELD = {"config": {"slo_p99_ms": 100.0}}
SAME_HOST = {"host": {"client": "h1", "server": "h1"}}


def _report(
    tmp_path: Path, name: str, device: str, samples: dict, meta: dict | None = None, **kw: Any
) -> dict:
    run = make_run(
        tmp_path / name,
        rate=100.0,
        duration_s=10.0,
        warmup_s=2.0,
        device=device,
        samples=samples,
        meta=meta,
        **kw,
    )
    return build_report(run, bootstrap=0)


def _rise(per_s: float) -> Any:
    return lambda t: per_s * t


def test_busy_gpu_missing_the_slo_without_a_backlog_is_gpu_bound_near_capacity(tmp_path: Path) -> None:
    """Offered just under capacity: the device is busy 90 % of the time, p99 over the SLO, no
    backlog yet in the window: gpu-bound, near capacity, with the device's figure."""
    r = _report(
        tmp_path,
        "gpu90",
        "cuda",
        {
            "netgain_gpu_utilization_ratio": 0.90,
            "netgain_kernel_busy_ratio": 0.88,
            "netgain_queue_depth_requests": 2.0,
        },
        MISSED,
    )
    b = r["bottleneck"]
    assert r["cost"]["slo_held"] is False and r["queue"]["pressure"] is False
    assert (b["kind"], b["resource"]) == ("gpu-bound", "gpu")
    assert "near capacity: no backlog has built yet (device busy 0.90 >= 0.85)" in b["evidence"]


def test_missed_slo_names_the_nearest_resource_with_its_figure(tmp_path: Path) -> None:
    """Nothing crossed its threshold (device 0.70, interpreter 0.40 core, process 2 of 8 cores) and
    no backlog, but p99 missed the SLO: the device, nearest its saturation, is named with its ratio."""
    samples = {
        "netgain_gpu_utilization_ratio": 0.70,
        "netgain_cpu_cores": 8,
        "netgain_process_cpu_ratio": 2.0,
        "netgain_thread_cpu_ratio": {"role=prepost": 0.3, "role=frontend": 0.1},
        "netgain_queue_depth_requests": 1.0,
    }
    b = _report(tmp_path, "near", "cuda", samples, MISSED)["bottleneck"]
    assert (b["kind"], b["resource"]) == ("gpu-bound", "gpu")
    ranking = next(e for e in b["evidence"] if e.startswith("SLO missed"))
    assert "p99" in ranking and "misses the SLO 5 ms" in ranking
    # device 0.70 / 0.85 = 0.82 ahead of interpreter 0.40 / 0.8 = 0.50 and process 2 / 7.2 = 0.28
    assert ranking.index("device busy 0.70 (saturated >= 0.85) at 0.82") < ranking.index("interpreter 0.40")
    assert "gpu: near capacity: no backlog has built yet" in b["evidence"]
    nearest = "no resource is near saturation (the nearest, gpu, is at 0.82"
    assert any(e.startswith(nearest) for e in b["evidence"])
    # the same figures under a held SLO are unsaturated: fixed cost, nothing to scale
    held = _report(tmp_path, "held", "cuda", samples, HELD)["bottleneck"]
    assert held["kind"] == "unsaturated" and not any("nearest" in e for e in held["evidence"])


def test_shed_requests_are_saturation_evidence(tmp_path: Path) -> None:
    """A text model on cuda that shed requests (RESOURCE_EXHAUSTED) with no queue rise in the gauge:
    never unsaturated; the frontend thread, nearest its saturation, is named."""
    shed = {i: "RESOURCE_EXHAUSTED" for i in range(300, 1000, 7)}
    r = _report(
        tmp_path,
        "shed",
        "cuda",
        {
            "netgain_gpu_utilization_ratio": 0.55,
            "netgain_cpu_cores": 8,
            "netgain_process_cpu_ratio": 3.0,
            "netgain_thread_cpu_ratio": {"role=prepost": 0.6, "role=frontend": 0.85},
            "netgain_queue_depth_requests": 3.0,
        },
        statuses=shed,
    )
    b = r["bottleneck"]
    assert r["errors"]["RESOURCE_EXHAUSTED"] == len(shed)
    assert b["kind"] == "upstream-bound" and b["resource"] == "interpreter"
    assert (
        f"{len(shed)} request(s) shed (RESOURCE_EXHAUSTED: the server's queue was full): a backlog"
        in (b["evidence"])
    )
    assert any("the backlog grows: never unsaturated" in e for e in b["evidence"])


def test_neighbouring_rates_of_a_sweep_get_the_same_kind(tmp_path: Path) -> None:
    """A sweep's runs whose device is about as busy and whose queue's rise wobbles around its
    threshold (rise 4, 12, 6, 14 requests over the window) all get one kind, above the busy line
    and below it (each run missed the SLO)."""
    for busy in ((0.86, 0.88, 0.87, 0.90), (0.74, 0.78, 0.76, 0.80)):
        kinds = []
        for i, (b, rise) in enumerate(zip(busy, (0.5, 1.5, 0.75, 1.75), strict=True)):
            samples = {
                "netgain_gpu_utilization_ratio": b,
                "netgain_kernel_busy_ratio": b - 0.02,
                "netgain_cpu_cores": 16,
                "netgain_process_cpu_ratio": 3.0,
                "netgain_thread_cpu_ratio": {"role=prepost": 0.3, "role=frontend": 0.2},
                "netgain_queue_depth_requests": _rise(rise),
            }
            r = _report(tmp_path, f"s{busy[0]}-{i}", "cuda", samples, MISSED)
            kinds.append((r["bottleneck"]["kind"], r["bottleneck"]["resource"], r["queue"]["pressure"]))
        assert [k[:2] for k in kinds] == [("gpu-bound", "gpu")] * 4, kinds
        assert [k[2] for k in kinds] == [False, True, False, True]  # the evidence that wobbled


HOST = {
    "netgain_host_cpu_cores": 4,
    "netgain_loadgen_cpu_seconds_total": _rise(0.3),
}


def _busy_host(busy: float, steal: float = 0.0) -> dict[str, Any]:
    """Host samples as netgain load writes them: counters in CPU seconds, read once a second."""
    return {
        **HOST,
        "netgain_host_cpu_seconds_total": {"mode=busy": _rise(busy), "mode=steal": _rise(steal)},
    }


CPU_SERVER = {
    "netgain_cpu_cores": 4,
    "netgain_process_cpu_ratio": 1.2,
    "netgain_thread_cpu_ratio": {"role=compute": 0.8, "role=device": 0.2, "role=prepost": 0.1},
    "netgain_kernel_busy_ratio": 0.5,
    "netgain_queue_depth_requests": 1.0,
}


def test_other_processes_on_a_full_host_are_the_likely_cause(tmp_path: Path) -> None:
    """A CPU run missing its SLO while the host is 3.9 of 4 cores busy, of which the server uses
    1.2 and the load generator 0.3: the other 2.4 cores (60 %) are the likely cause."""
    r = _report(tmp_path, "contended", "cpu", {**CPU_SERVER, **_busy_host(3.9)}, {**MISSED, **SAME_HOST})
    b, host = r["bottleneck"], r["cpu"]["host"]
    assert host["same_host"] is True and host["significant"] is True
    assert abs(host["other"] - 2.4) < 1e-9 and abs(host["other_share"] - 0.6) < 1e-9
    assert (b["kind"], b["resource"]) == ("host-contention", "host")
    assert "a host (or cores) of its own" in b["action"]
    line = next(e for e in b["evidence"] if e.startswith("host: "))
    assert "3.90 of 4 cores busy" in line and "server 1.20, other processes 2.40 (60% of the host" in line
    assert any(e.startswith("host contention, not the server, is the likely cause") for e in b["evidence"])


def test_steal_time_is_host_contention(tmp_path: Path) -> None:
    """The hypervisor took 0.4 of 4 cores (10 %) while the server's resources had headroom."""
    r = _report(
        tmp_path, "steal", "cpu", {**CPU_SERVER, **_busy_host(1.6, steal=0.4)}, {**MISSED, **SAME_HOST}
    )
    assert r["bottleneck"]["kind"] == "host-contention"
    assert any("steal 0.40 (10%; significant >= 5%)" in e for e in r["bottleneck"]["evidence"])


def test_contention_is_evidence_when_the_server_itself_is_saturated(tmp_path: Path) -> None:
    """The server's model compute uses 3.5 of 4 cores: cpu-bound, the busy host said beside it."""
    samples = {
        **CPU_SERVER,
        "netgain_process_cpu_ratio": 3.6,
        "netgain_thread_cpu_ratio": {"role=compute": 3.3, "role=device": 0.2},
        **_busy_host(3.95),
        "netgain_host_cpu_cores": 6,
    }
    r = _report(tmp_path, "own", "cpu", samples, {**MISSED, **SAME_HOST})
    b = r["bottleneck"]
    assert (b["kind"], b["resource"]) == ("cpu-bound", "model compute")
    assert any(e.startswith("host: ") for e in b["evidence"])
    assert not any("likely cause" in e for e in b["evidence"])


def test_a_quiet_host_and_a_server_elsewhere(tmp_path: Path) -> None:
    """Host contention is not significant on a quiet host, and not judged for a server on another
    host (its host's other processes are not measured): the server's nearest resource is named."""
    quiet = _report(tmp_path, "quiet", "cpu", {**CPU_SERVER, **_busy_host(1.6)}, {**MISSED, **SAME_HOST})
    assert quiet["cpu"]["host"]["significant"] is False
    assert quiet["bottleneck"]["kind"] == "cpu-bound"
    assert any("host contention not significant" in e for e in quiet["bottleneck"]["evidence"])
    far = _report(tmp_path, "far", "cpu", {**CPU_SERVER, **_busy_host(3.9)}, MISSED)
    assert far["cpu"]["host"]["same_host"] is False and far["cpu"]["host"]["other"] is None
    assert far["bottleneck"]["kind"] == "cpu-bound"
    assert any("the server runs on another host" in e for e in far["bottleneck"]["evidence"])


def test_a_missed_slo_without_server_figures_is_unknown_not_unsaturated(tmp_path: Path) -> None:
    r = _report(tmp_path, "bare", "cpu", {}, MISSED)
    assert r["bottleneck"]["kind"] == "unknown"
    assert any("no server resource measured" in e for e in r["bottleneck"]["evidence"])


def test_the_host_line_names_the_servers_cores_and_cpu(tmp_path: Path) -> None:
    """Machines of one kind differ several-fold: the evidence says which cores and CPU served."""
    cores = "0-11 (12 logical on 6 physical cores)"
    hardware = {"server": {"cpu": "Example CPU 9000", "server_cores": cores, "cpu_isa": "AVX2"}}
    r = _report(
        tmp_path,
        "hw",
        "cpu",
        {**CPU_SERVER, **_busy_host(1.6)},
        {**MISSED, **SAME_HOST, "versions": hardware},
    )
    line = next(e for e in r["bottleneck"]["evidence"] if e.startswith("host: "))
    assert line.endswith(
        "; server cores 0-11 (12 logical on 6 physical cores), Example CPU 9000, torch CPU kernels AVX2"
    )
    assert r["cpu"]["host"]["cpu_model"] == "Example CPU 9000"
    assert r["cpu"]["host"]["cpu_isa"] == "AVX2"


def test_the_host_line_warns_when_torch_gets_no_vector_instructions(tmp_path: Path) -> None:
    """A virtual machine that hides AVX2 slows a CPU forward several-fold: the evidence says so."""
    hardware = {"server": {"cpu": "Example CPU 9000", "cpu_isa": "DEFAULT"}}
    r = _report(
        tmp_path,
        "noisa",
        "cpu",
        {**CPU_SERVER, **_busy_host(1.6)},
        {**MISSED, **SAME_HOST, "versions": hardware},
    )
    line = next(e for e in r["bottleneck"]["evidence"] if e.startswith("host: "))
    assert "torch CPU kernels DEFAULT (no vector instructions reach torch on this host" in line
