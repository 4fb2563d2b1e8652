"""``netgain serve --workers N``: real frontend processes and a device process on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from conftest import REPO_ROOT, run_netgain, server_env
from prometheus_client.parser import text_string_to_metric_families

from netgain.contract.cores import cpu_list
from netgain.contract.payloads import null_bytes, synthetic_jpeg
from netgain.contract.phases import PHASES, TIMING_KEY, parse_trailer
from netgain.protos import InferenceStub, pb

pytestmark = pytest.mark.slow


def channels(target: str, n: int) -> list[grpc.Channel]:
    """``n`` channels with a TCP connection each: the kernel spreads connections over frontends."""
    return [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(n)]


def burst(target: str, model: str, conns: int, per_conn: int, seed: int = 0) -> list[tuple[Any, Any]]:
    """Every connection sends ``per_conn`` requests at once (threads start together); returns
    (response or RpcError, trailing metadata) for each."""
    rng = random.Random(seed)
    make = (lambda: synthetic_jpeg(rng, 20_000)) if model == "image" else (lambda: null_bytes(rng, 64))
    reqs = [pb.InferRequest(inputs=[pb.Input(data=make())]) for _ in range(8)]
    chans = channels(target, conns)
    out: list[tuple[Any, Any]] = []
    lock = threading.Lock()
    gate = threading.Barrier(conns)

    def client(i: int) -> None:
        stub = InferenceStub(chans[i])
        gate.wait()
        for j in range(per_conn):
            try:
                resp, call = stub.Infer.with_call(
                    reqs[(i + j) % len(reqs)], metadata=[("x-request-id", f"c{i}-{j}")], timeout=60
                )
                item = (resp, dict(call.trailing_metadata()))
            except grpc.RpcError as exc:
                item = (exc, dict(exc.trailing_metadata() or ()))
            with lock:
                out.append(item)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in chans:
        c.close()
    return out


def frontends(handle: Any) -> list[psutil.Process]:
    """The supervisor's children that listen on the gRPC port."""
    kids = psutil.Process(handle.pid).children()
    return [k for k in kids if any(c.laddr.port == handle.grpc_port for c in k.net_connections("tcp"))]


def test_workers_answer_many_connections_with_every_phase_and_batch_across_frontends(
    start_server: Any,
) -> None:
    s = start_server(
        "--model", "image", "--workers", "2", "--max-batch-size", "16", "--max-queue-delay-ms", "30",
        "--handler-option", "size=64",
    )  # fmt: skip
    results = []
    mixed: set[int] = set()
    for rnd in range(10):  # bounded: stops at the first round whose batches mix both frontends
        results += burst(s.target, "image", 16, 2, seed=rnd)
        time.sleep(0.3)  # the recorder drains span lines every 50 ms
        by_batch: dict[int, set[int]] = defaultdict(set)
        for rec in s.span_lines():
            if rec["code"] == "OK":
                by_batch[rec["batch_id"]].add(rec["pid"])
        mixed = {b for b, pids in by_batch.items() if len(pids) > 1}
        if mixed:
            break
    assert all(isinstance(r, pb.InferResponse) for r, _ in results), [r for r, _ in results][:3]
    for resp, trailers in results:
        phases, _ = parse_trailer(trailers[TIMING_KEY])
        assert set(PHASES) <= set(phases), trailers[TIMING_KEY]
        parts = sum(phases[p] for p in PHASES)
        assert abs(parts - phases["total"]) <= 0.02 * phases["total"] + 0.01, trailers[TIMING_KEY]
        assert len(resp.outputs) == 1 and resp.batch_size >= 1
    pids = {rec["pid"] for rec in s.span_lines()}
    assert len(pids) == 2, pids  # 16 connections: both frontends answered
    assert pids == {p.pid for p in frontends(s)}
    assert mixed, "no batch held requests of both frontends in 10 bursts"


def test_metrics_of_every_process_on_one_endpoint(start_server: Any) -> None:
    s = start_server("--model", "null", "--workers", "2")
    results = burst(s.target, "null", 8, 5)
    assert all(isinstance(r, pb.InferResponse) for r, _ in results)
    deadline = time.monotonic() + 20
    while True:
        fams = {f.name: f for f in text_string_to_metric_families(s.metrics_text())}
        ok = [x.value for x in fams["netgain_requests"].samples if x.labels.get("code") == "OK"]
        duration = fams["netgain_request_duration_seconds"].samples
        count = [x.value for x in duration if x.name.endswith("_count")]
        # The histogram is filled by each process's recorder thread, after the request counter.
        if (ok == [40.0] and count == [40.0]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ok == [40.0]
    assert count == [40.0]
    batches = [x.value for x in fams["netgain_batches"].samples if x.name.endswith("_total")]
    assert batches and batches[0] >= 1  # the device process's counter, on the same endpoint
    assert [x.value for x in fams["netgain_ready"].samples] == [1.0]
    # Counters of CPU time add up over the processes; the start time is the first process's.
    assert [x.value for x in fams["netgain_server_info"].samples] == [1.0]
    assert "# TYPE netgain_server info" in s.metrics_text(openmetrics=True)
    assert [x.value for x in fams["netgain_device_instances"].samples] == [1.0]
    cpu = [x.value for x in fams["process_cpu_seconds"].samples]
    assert len(cpu) == 1 and cpu[0] > 0
    starts = [x.value for x in fams["process_start_time_seconds"].samples]
    assert len(starts) == 1 and 0 < time.time() - starts[0] < 600  # the earliest, not a sum of three
    roles = {x.labels["role"]: x.value for x in fams["netgain_thread_cpu_seconds"].samples}
    assert roles.get("frontend", 0) > 0 and all(v >= 0 for v in roles.values())
    assert "# EOF" in s.metrics_text(openmetrics=True)
    info = s.stub().ServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert info.batching.workers == 2 and info.batching.slots_per_worker >= 8  # what meta.json records
    usable = sorted(os.sched_getaffinity(0))  # the server inherits this process's cores
    assert info.versions["server_cores"].startswith(f"{cpu_list(usable)} ({len(usable)} logical")


def test_a_killed_frontend_leaves_the_others_serving(start_server: Any) -> None:
    s = start_server("--model", "null", "--workers", "2")
    fronts = frontends(s)
    assert len(fronts) == 2
    fronts[0].kill()
    fronts[0].wait(10)
    deadline = time.monotonic() + 30
    while "1 of 2 frontends still serving" not in s.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"pid {fronts[0].pid}) exited (killed by SIGKILL)" in s.output()
    results = burst(s.target, "null", 4, 5)  # new connections reach the frontend left
    assert all(isinstance(r, pb.InferResponse) for r, _ in results), [r for r, _ in results][:3]
    assert s.proc.poll() is None


def test_a_frontend_killed_while_pre_processing_anothers_request_leaves_none_waiting(
    start_server: Any, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    s = start_server(
        "--model", "bottleneck_handlers:SlowTagged", "--handler-option", "sleep_ms=2000",
        "--handler-option", f"mark_dir={marks}", "--workers", "2", "--pre-threads", "1",
    )  # fmt: skip
    chan = grpc.insecure_channel(s.target)
    stub = InferenceStub(chan)
    stub.Infer(pb.InferRequest(inputs=[pb.Input(data=b"fast")]), timeout=30)  # one connection, open
    owner = [
        k
        for k in frontends(s)
        if any(
            c.status == psutil.CONN_ESTABLISHED and c.laddr.port == s.grpc_port
            for c in k.net_connections("tcp")
        )
    ]
    assert len(owner) == 1
    other = next(k for k in frontends(s) if k.pid != owner[0].pid)
    slow = pb.InferRequest(inputs=[pb.Input(data=b"slow")])
    futures = [stub.Infer.future(slow, timeout=60) for _ in range(4)]
    deadline = time.monotonic() + 30
    # Each frontend's one pre-processing thread holds one of them, asleep for 2 s.
    while {owner[0].pid, other.pid} - {int(f.name.split("-")[0]) for f in marks.iterdir()}:
        assert time.monotonic() < deadline, "the frontends never both took a slow request"
        time.sleep(0.02)
    other.kill()
    started = time.monotonic()
    outcomes: list[Any] = []
    for f in futures:
        try:
            f.result()
            outcomes.append("OK")
        except grpc.RpcError as exc:
            outcomes.append((exc.code(), exc.details()))
    chan.close()
    assert time.monotonic() - started < 30, outcomes  # answered, not left to the 60 s deadline
    assert "OK" in outcomes, outcomes  # the owner's own thread pre-processed the rest
    assert any(
        o[0] == grpc.StatusCode.UNAVAILABLE and "exited while pre-processing" in o[1]
        for o in outcomes
        if o != "OK"
    ), outcomes


def test_pre_processes_take_every_frontends_requests_and_exits_are_reported(start_server: Any) -> None:
    s = start_server(
        "--model", "bottleneck_handlers:PidPre", "--handler-option", "pre_ms=2",
        "--workers", "2", "--pre-processes", "2", "--max-queue-delay-ms", "5",
    )  # fmt: skip
    kids = psutil.Process(s.pid).children()
    pres = {k.pid for k in kids if "-pre-" in k.name()}  # the comm name: "ng-pre-2"
    assert len(kids) == 5 and len(pres) == 2, [k.name() for k in kids]
    assert "2 frontend, 2 pre-processing and 1 device process" in s.output()
    info = s.stub().ServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert (info.batching.workers, info.batching.pre_processes) == (2, 2)
    results = burst(s.target, "null", 8, 10)
    assert all(isinstance(r, pb.InferResponse) for r, _ in results), [r for r, _ in results][:3]
    who = {r.outputs[0].label for r, _ in results}
    assert who == pres, (who, pres)  # both took work, and no frontend pre-processed any
    for _, trailers in results:
        phases, _ = parse_trailer(trailers[TIMING_KEY])
        assert phases["pre"] >= 1.5, trailers[TIMING_KEY]  # the 2 ms measured where it ran
    one = psutil.Process(min(pres))
    one.kill()
    one.wait(10)
    deadline = time.monotonic() + 30
    while "1 of 2 pre-processing processes left" not in s.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"pid {one.pid}) exited (killed by SIGKILL)" in s.output()
    results = burst(s.target, "null", 4, 5)
    assert {r.outputs[0].label for r, _ in results if isinstance(r, pb.InferResponse)} == {max(pres)}
    assert s.proc.poll() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--device-cores needs 2 usable cores")
def test_device_cores_run_the_device_process_alone_on_the_highest_cores(start_server: Any) -> None:
    usable = sorted(os.sched_getaffinity(0))
    s = start_server("--model", "null", "--workers", "1", "--pre-processes", "1", "--device-cores", "1")
    kids = {k.name(): k for k in psutil.Process(s.pid).children()}  # comm names: ng-device, ng-front-0, ...
    assert len(kids) == 3, list(kids)
    assert kids.pop("ng-device").cpu_affinity() == usable[-1:]
    for name, kid in kids.items():
        assert kid.cpu_affinity() == usable[:-1], name
    assert psutil.Process(s.pid).cpu_affinity() == usable[:-1]
    assert f"1 device process alone on cores {usable[-1]} (" in s.output()
    results = burst(s.target, "null", 4, 5)
    assert all(isinstance(r, pb.InferResponse) for r, _ in results), [r for r, _ in results][:3]
    info = s.stub().ServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert info.versions["server_cores"].startswith(f"{cpu_list(usable)} ({len(usable)} logical")


@pytest.mark.parametrize(("pre", "loop"), [("0", "auto"), ("1", "asyncio")])
def test_sigterm_drains_every_process(start_server: Any, pre: str, loop: str) -> None:
    """On either event loop (auto: uvloop where installed), the frontends drain on SIGTERM."""
    s = start_server(
        "--model", "image", "--workers", "2", "--pre-processes", pre, "--max-queue-delay-ms", "50",
        "--event-loop", loop,
    )  # fmt: skip
    named = "asyncio" if loop == "asyncio" or importlib.util.find_spec("uvloop") is None else "uvloop"
    assert f"frontends on {named}'s event loop" in s.output()
    kids = psutil.Process(s.pid).children()
    assert len(kids) == 3 + int(pre)  # two frontends, the pre-processing processes and the device process
    results: list[tuple[Any, Any]] = []
    sender = threading.Thread(target=lambda: results.extend(burst(s.target, "image", 8, 3)))
    sender.start()
    deadline = time.monotonic() + 30
    while not s.span_lines() and time.monotonic() < deadline:  # requests are flowing
        time.sleep(0.05)
    s.proc.send_signal(signal.SIGTERM)
    sender.join(120)
    assert s.proc.wait(90) == 0
    codes = {r.code() if isinstance(r, grpc.RpcError) else grpc.StatusCode.OK for r, _ in results}
    assert grpc.StatusCode.OK in codes and codes <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    out = s.output()
    assert "draining" in out and "stopped" in out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_second_server_on_a_served_port_fails_in_one_line(start_server: Any, workers: str) -> None:
    s = start_server("--model", "null", "--workers", "2")
    res = subprocess.run(
        [sys.executable, "-m", "netgain.server", "--model", "null", "--workers", workers,
         "--host", "127.0.0.1", "--port", str(s.grpc_port), "--metrics-port", "-1"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=server_env(),
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--port {s.grpc_port}" in lines[0] and "already in use" in lines[0], lines
    assert os.path.exists(f"/proc/{s.pid}")


def test_a_cpu_device_process_with_several_threads_serves_full_size_images(start_server: Any) -> None:
    """The device process runs the model on several OpenMP threads: nothing the supervisor ran
    before forking (the handler check, the item sizing) may leave it a thread pool without threads,
    which deadlocked the first full-size batch and the server never became SERVING."""
    s = start_server("--model", "image", "--workers", "2", "--intra-op-threads", "4", "--max-batch-size", "4")
    results = burst(s.target, "image", 2, 2)
    assert len(results) == 4 and all(isinstance(r, pb.InferResponse) for r, _ in results), results[:1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two pinned processes need 2 cores")
def test_pinned_pre_processes_each_run_on_a_core_of_their_own(start_server: Any) -> None:
    usable = sorted(os.sched_getaffinity(0))
    s = start_server("--model", "image", "--workers", "1", "--pre-processes", "2", "--pin-pre-processes")
    kids = {k.name(): k for k in psutil.Process(s.pid).children()}
    pres = sorted(name for name in kids if name.startswith("ng-pre"))
    assert len(pres) == 2, list(kids)
    assert [kids[name].cpu_affinity() for name in pres] == [[usable[-1]], [usable[-2]]]
    assert kids["ng-front-0"].cpu_affinity() == usable  # the frontends float
    assert "2 pre-processing (one core each)" in s.output()
    results = burst(s.target, "image", 4, 5)
    assert all(isinstance(r, pb.InferResponse) for r, _ in results), [r for r, _ in results][:3]


@pytest.mark.parametrize(
    "layout, why",
    [
        (("--workers", "1", "--device", "cpu"), "this layout has none on cpu"),
        (("--workers", "0"), "--workers and --pre-processes above 0"),
    ],
)
def test_pinning_without_pre_processing_processes_fails_in_one_line(
    layout: tuple[str, ...], why: str
) -> None:
    res = run_netgain(
        "serve", "--model", "null", *layout, "--pin-pre-processes", "--port", "0", "--metrics-port", "-1"
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--pin-pre-processes needs pre-processing processes" in lines[0], lines
    assert why in lines[0], lines
