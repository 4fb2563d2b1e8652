"""Bottleneck kinds from synthetic samples whose saturation is known."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import make_run

from netgain.analysis import build_report


def _kind(tmp_path: Path, device: str, samples: dict) -> dict:
    run = make_run(
        tmp_path / device, rate=100.0, duration_s=10.0, warmup_s=2.0, device=device, samples=samples
    )
    return build_report(run, bootstrap=0)["bottleneck"]


def growing(t: float) -> float:
    return 5.0 * t  # +40 requests over the 8 s window


def test_upstream_bound_idle_gpu_saturated_prepost(tmp_path: Path) -> None:
    b = _kind(
        tmp_path,
        "cuda",
        {
            "netgain_gpu_utilization_ratio": 0.15,
            "netgain_kernel_busy_ratio": 0.1,
            "netgain_cpu_cores": 8,
            "netgain_process_cpu_ratio": 2.5,
            "netgain_thread_cpu_ratio": {"role=prepost": 1.96, "role=frontend": 0.3},
            "netgain_queue_depth_requests": growing,
        },
    )
    assert b["kind"] == "upstream-bound"
    assert any("prepost" in e for e in b["evidence"])


def test_gpu_bound(tmp_path: Path) -> None:
    b = _kind(
        tmp_path,
        "cuda",
        {
            "netgain_gpu_utilization_ratio": 0.97,
            "netgain_kernel_busy_ratio": 0.95,
            "netgain_thread_cpu_ratio": {"role=prepost": 0.4},
            "netgain_queue_depth_requests": growing,
        },
    )
    assert b["kind"] == "gpu-bound"


@pytest.mark.parametrize("dtype, named", [("float32", True), (None, True), ("bfloat16", False)])
def test_a_gpu_bound_float32_forward_names_a_lower_precision_before_a_bigger_device(
    tmp_path: Path, dtype: str | None, named: bool
) -> None:
    samples = {"netgain_gpu_utilization_ratio": 0.97, "netgain_queue_depth_requests": growing}
    meta = {"server": {"model": "bert-base", "dtype": dtype}}
    run = make_run(
        tmp_path, rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda", samples=samples, meta=meta
    )
    b = build_report(run, bootstrap=0)["bottleneck"]
    assert b["kind"] == "gpu-bound"
    lever = "a lower precision (--dtype bfloat16, where the model's accuracy allows), then a bigger device"
    assert (lever in b["action"]) is named, b["action"]
    assert b["action"].startswith("batch more (--max-batch-size, --max-queue-delay-ms), ")


def test_busy_gpu_without_queue_is_gpu_bound_near_capacity(tmp_path: Path) -> None:
    """A device busy 97 % of the time has no headroom left, though no backlog has built yet."""
    b = _kind(tmp_path, "cuda", {"netgain_gpu_utilization_ratio": 0.97, "netgain_queue_depth_requests": 1.0})
    assert b["kind"] == "gpu-bound"
    assert "near capacity: no backlog has built yet (device busy 0.97 >= 0.85)" in b["evidence"]


def test_cpu_bound(tmp_path: Path) -> None:
    b = _kind(
        tmp_path,
        "cpu",
        {
            "netgain_cpu_cores": 4,
            "netgain_process_cpu_ratio": 3.9,
            "netgain_thread_cpu_ratio": {"role=compute": 3.6, "role=prepost": 0.2},
            "netgain_kernel_busy_ratio": 0.95,
            "netgain_queue_depth_requests": growing,
        },
    )
    assert b["kind"] == "cpu-bound"


def test_cpu_bound_counts_the_device_thread_with_the_intra_op_threads(tmp_path: Path) -> None:
    """On a CPU run the forward pass runs on the device worker thread and torch's workers: 2.5 + 0.9
    of 4 cores is 85 %, saturated, though neither role alone reaches 80 %."""
    b = _kind(
        tmp_path,
        "cpu",
        {
            "netgain_cpu_cores": 4,
            "netgain_process_cpu_ratio": 3.5,
            "netgain_thread_cpu_ratio": {"role=compute": 2.5, "role=device": 0.9, "role=prepost": 0.05},
            "netgain_queue_depth_requests": 0,
        },
    )
    assert b["kind"] == "cpu-bound"
    assert "model compute (device + intra-op threads) 3.40 of 4.00 cores (saturated >= 0.8)" in b["evidence"]


def test_loadgen_bound_by_worker_cpu(tmp_path: Path) -> None:
    b = _kind(tmp_path, "cpu", {"netgain_client_worker_cpu_ratio": 0.97, "netgain_cpu_cores": 4})
    assert b["kind"] == "loadgen-bound"
    assert any("0.97" in e for e in b["evidence"])


def test_unsaturated_and_no_samples(tmp_path: Path) -> None:
    b = _kind(
        tmp_path,
        "cpu",
        {
            "netgain_cpu_cores": 4,
            "netgain_process_cpu_ratio": 0.5,
            "netgain_thread_cpu_ratio": {"role=compute": 0.4},
            "netgain_queue_depth_requests": 0,
        },
    )
    assert b["kind"] == "unsaturated"


def test_queue_at_half_capacity_is_pressure(tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "q",
        rate=100.0,
        duration_s=10.0,
        warmup_s=2.0,
        device="cuda",
        samples={"netgain_gpu_utilization_ratio": 0.9, "netgain_queue_depth_requests": 200.0},
    )
    r = build_report(run, bootstrap=0)
    assert (
        r["queue"]["pressure"] is True
        and r["queue"]["mean"] == 200.0
        and r["bottleneck"]["kind"] == "gpu-bound"
    )
    assert r["gpu"]["utilization_mean"] == pytest.approx(0.9)


def _run(tmp_path: Path, name: str, samples: dict, **kw: object) -> dict:
    run = make_run(
        tmp_path / name, rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda", samples=samples, **kw
    )
    return build_report(run, bootstrap=0)


SATURATED_GPU = {
    "netgain_gpu_utilization_ratio": 0.95,
    "netgain_kernel_busy_ratio": 0.91,
    "netgain_queue_depth_requests": growing,
    "netgain_client_worker_cpu_ratio": 0.3,
}


def test_drops_caused_by_a_saturated_target_name_the_servers_bottleneck(tmp_path: Path) -> None:
    """The generator kept its schedule, the server's backlog filled the in-flight cap: the run is
    INVALID, and the kind is the server's (gpu-bound), not loadgen-bound."""
    r = _run(tmp_path, "drops", SATURATED_GPU, statuses={900: "DROPPED", 901: "DROPPED"})
    b = r["bottleneck"]
    assert r["valid"] is False and b["kind"] == "gpu-bound" and b["drops_caused_by"] == "target"
    assert [k["kind"] for k in b["kinds"]] == ["gpu-bound"]
    assert any("caused by the saturated target" in e for e in b["kinds"][0]["evidence"])
    assert "batch more" in b["action"] and "capacity at the SLO" in b["action"]


def test_generator_behind_and_server_saturated_says_both(tmp_path: Path) -> None:
    r = _run(tmp_path, "both", {**SATURATED_GPU, "netgain_client_worker_cpu_ratio": 0.97})
    b = r["bottleneck"]
    assert [k["kind"] for k in b["kinds"]] == ["loadgen-bound", "gpu-bound"]
    gen, srv = b["kinds"]
    assert any("load worker CPU max 0.97" in e for e in gen["evidence"])
    assert any("kernel busy 0.91" in e for e in srv["evidence"])
    assert "netgain load --workers" in gen["action"] and "batch more" in srv["action"]


def test_drops_with_a_generator_behind_are_the_generators(tmp_path: Path) -> None:
    r = _run(
        tmp_path,
        "gen",
        {"netgain_client_worker_cpu_ratio": 0.3, "netgain_queue_depth_requests": 0.0},
        statuses={900: "DROPPED"},
        late=(0.2, 40.0),
    )
    b = r["bottleneck"]
    assert b["kind"] == "loadgen-bound" and b["drops_caused_by"] == "generator"
    assert any("could not keep up" in e for e in b["evidence"])


def test_growing_queue_is_never_unsaturated(tmp_path: Path) -> None:
    """The queue rises while no gauge crosses a threshold: saturated upstream of an idle device."""
    r = _run(
        tmp_path,
        "q",
        {
            "netgain_gpu_utilization_ratio": 0.2,
            "netgain_kernel_busy_ratio": 0.1,
            "netgain_thread_cpu_ratio": {"role=prepost": 0.4, "role=frontend": 0.2},
            "netgain_queue_depth_requests": growing,
        },
    )
    assert r["bottleneck"]["kind"] == "upstream-bound"
    assert any("never" in e or "backlog grows" in e for e in r["bottleneck"]["evidence"])


def test_interpreter_is_judged_per_process_from_the_span_log_pids(tmp_path: Path) -> None:
    """prepost + frontend sum to 1.6 cores over 4 frontends (span log pids, 25 % each): 0.4 core per
    interpreter, not saturated; the same sum in one process is."""
    import json

    samples = {
        "netgain_gpu_utilization_ratio": 0.2,
        "netgain_kernel_busy_ratio": 0.2,
        "netgain_thread_cpu_ratio": {"role=prepost": 1.2, "role=frontend": 0.4},
        "netgain_queue_depth_requests": growing,
    }
    run = make_run(tmp_path / "mp", rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda", samples=samples)
    for pids, per_process in (((11, 12, 13, 14), 0.4), ((11,), 1.6)):
        log = tmp_path / f"spans{len(pids)}.jsonl"
        lines = (json.dumps({"id": f"r{i:08d}", "pid": pids[i % len(pids)]}) for i in range(1000))
        log.write_text("".join(f"{x}\n" for x in lines))
        r = build_report(run, bootstrap=0, span_log=log)
        interp = r["cpu"]["interpreter"]
        assert interp["processes"] == len(pids) and interp["approximate"] is False
        assert interp["per_process"] == pytest.approx(per_process)
    assert r["bottleneck"]["resource"] == "interpreter"


def test_a_server_using_all_its_cores_is_never_unsaturated(tmp_path: Path) -> None:
    """Frontends that cannot read their sockets leave no backlog in any queue gauge; the busy
    cores alone name the bottleneck (a GPU half busy, no queue rise)."""
    samples = {
        "netgain_gpu_utilization_ratio": 0.6,
        "netgain_kernel_busy_ratio": 0.6,
        "netgain_cpu_cores": 10,
        "netgain_process_cpu_ratio": 9.7,
        "netgain_thread_cpu_ratio": {"role=prepost": 6.9, "role=frontend": 2.1},
        "netgain_queue_depth_requests": 2.0,
    }
    b = _kind(tmp_path, "cuda", samples)
    assert (b["kind"], b["resource"]) == ("upstream-bound", "process")
    assert any("9.70 of its 10.00 cores" in e for e in b["evidence"])
    samples["netgain_process_cpu_ratio"] = 7.0
    assert _kind(tmp_path / "headroom", "cuda", samples)["kind"] == "unsaturated"


@pytest.mark.parametrize(
    ("model", "options", "named"),
    [
        ("image", {}, True),
        ("resnet50", {"decode": "cpu"}, True),
        ("image", {"decode": "gpu"}, False),  # already decoding on the GPU
        ("text", {}, False),  # no such option
    ],
)
def test_upstream_bound_image_handler_names_gpu_decode(
    tmp_path: Path, model: str, options: dict[str, str], named: bool
) -> None:
    """An image handler bound by CPU pre-processing on a GPU: the action names decode=gpu."""
    samples = {
        "netgain_gpu_utilization_ratio": 0.15,
        "netgain_kernel_busy_ratio": 0.1,
        "netgain_cpu_cores": 8,
        "netgain_process_cpu_ratio": 2.5,
        "netgain_thread_cpu_ratio": {"role=prepost": 1.96, "role=frontend": 0.3},
        "netgain_queue_depth_requests": growing,
    }
    meta = {"server": {"model": model, "handler_options": options}}
    run = make_run(
        tmp_path, rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda", samples=samples, meta=meta
    )
    b = build_report(run, bootstrap=0)["bottleneck"]
    assert (b["kind"], b["resource"]) == ("upstream-bound", "interpreter")
    assert ("GPU pre-processing with --handler-option decode=gpu" in b["action"]) is named, b["action"]
    assert "GPU pre-processing" in b["action"]
    assert all(k["action"] == b["action"] for k in b["kinds"])


def test_requests_shed_while_p99_met_the_slo_name_the_queue_bound(tmp_path: Path) -> None:
    """A busy GPU that shed requests at its queue bound while p99 stayed within the SLO: the bound,
    not latency, refused them, so the action names --max-queue-size; without an SLO it cannot say."""
    shed = {i: "RESOURCE_EXHAUSTED" for i in range(900, 904)}
    run = make_run(
        tmp_path / "shed", rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda",
        samples=SATURATED_GPU, statuses=shed,
    )  # fmt: skip
    b = build_report(run, slo_p99_ms=100.0, bootstrap=0)["bottleneck"]
    line = (
        "4 request(s) shed at --max-queue-size 256 while p99 met the SLO: the bound, not latency, "
        "refused them (a larger bound queues them instead)"
    )
    assert b["kind"] == "gpu-bound" and line in b["evidence"] and line in b["kinds"][0]["evidence"]
    assert b["action"].startswith("batch more") and b["action"].endswith(
        "or a larger --max-queue-size, which queues the requests it now sheds within the SLO"
    )
    # Over the SLO (or with none given) the queue bound is no lever: latency refuses them anyway.
    for slo in (1.0, None):
        b = build_report(run, slo_p99_ms=slo, bootstrap=0)["bottleneck"]
        assert "--max-queue-size" not in b["action"] and line not in b["evidence"]
