"""The Profile RPC on a real CPU server: a full capture records every operator, a ranges-only
capture records netgain's batch ranges and nothing per operator; one capture at a time, and a
capture whose caller goes away is stopped; a profiler that fails to start leaves nothing on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import ServerHandle, ServerLauncher

from netgain.protos import pb

# Every test here starts a server process.
pytestmark = pytest.mark.slow


def capture(server: ServerHandle, ranges_only: bool, batches: int = 3) -> tuple[Any, list[dict[str, Any]]]:
    """Profile ``batches`` batches while a thread keeps one tabular request in flight at a time."""
    stub = server.stub()
    stop = threading.Event()

    def load() -> None:
        for _ in range(2000):  # bounded: the capture needs only a few batches
            if stop.is_set():
                return
            try:
                stub.Infer(
                    pb.InferRequest(model="tabular", inputs=[pb.Input(features=[0.5] * 64)]), timeout=30
                )
            except grpc.RpcError:  # the profiler's start holds the event loop; on a busy host it may
                continue  # outlast a call's deadline: keep feeding batches until the capture is done

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        resp = stub.Profile(pb.ProfileRequest(batches=batches, ranges_only=ranges_only), timeout=60)
    finally:
        stop.set()
        t.join(10)
    with open(resp.trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    return resp, [e for e in events if e.get("ph") == "X"]


def test_full_and_ranges_only_captures(start_server: ServerLauncher, tmp_path: Path) -> None:
    server = start_server(
        "--model", "tabular", "--profile-dir", str(tmp_path / "prof"), "--max-queue-delay-ms", "1"
    )
    for ranges_only in (False, True):
        resp, spans = capture(server, ranges_only)
        assert resp.batches == 3 and len(resp.batch_ids) == 3
        assert Path(resp.trace_path).parent == tmp_path / "prof"
        names = {str(e.get("name")) for e in spans}
        assert {f"netgain_batch_{b}" for b in resp.batch_ids} <= names
        operators = [n for n in names if n.startswith("aten::")]
        if ranges_only:
            assert operators == [], operators[:5]
        else:
            assert "aten::addmm" in operators  # the MLP's linear layers


@pytest.mark.gpu
def test_ranges_only_capture_on_cuda_keeps_kernels(start_server: ServerLauncher, tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the GPU machine)")
    server = start_server(
        "--model", "tabular", "--device", "cuda", "--profile-dir", str(tmp_path), "--max-queue-delay-ms", "1"
    )
    resp, spans = capture(server, ranges_only=True)
    names = {str(e.get("name")) for e in spans}
    assert {f"netgain_batch_{b}" for b in resp.batch_ids} <= names
    assert not [n for n in names if n.startswith("aten::")]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    launches = [e for e in spans if e.get("cat") == "cuda_runtime" and "Launch" in str(e.get("name"))]
    assert len(kernels) >= 3 and len(launches) >= 3  # the MLP's layers, for each batch


def test_one_capture_at_a_time_and_an_abandoned_one_is_stopped(
    start_server: ServerLauncher, tmp_path: Path
) -> None:
    server = start_server("--model", "tabular", "--profile-dir", str(tmp_path), "--max-queue-delay-ms", "1")
    stub = server.stub()
    # No load: whichever capture the server takes first waits for batches until its caller's
    # deadline ends it; the other, sent while it waits, is refused.
    calls = [
        stub.Profile.future(pb.ProfileRequest(batches=1000, ranges_only=True), timeout=5.0),
        stub.Profile.future(pb.ProfileRequest(batches=2), timeout=5.0),
    ]
    ended: dict[grpc.StatusCode, str] = {}
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call.result()
        ended[err.value.code()] = err.value.details() or ""
    assert set(ended) == {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED}, ended
    assert "already running" in ended[grpc.StatusCode.FAILED_PRECONDITION]
    # The abandoned capture was stopped, so a new one is accepted and completes.
    deadline = time.monotonic() + 10.0
    while True:
        try:
            resp, spans = capture(server, ranges_only=False, batches=2)
            break
        except grpc.RpcError as exc:  # the server may still be unwinding the abandoned call
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert resp.batches == 2 and any(str(e.get("name")).startswith("aten::") for e in spans)


def test_profiler_that_fails_to_start_leaves_nothing_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch._C._autograd as autograd_c
    import torch.autograd.profiler as ap

    from netgain.server.batching.profile import ProfileCapture, ProfilerUnavailable

    def refuse(*args: Any) -> None:
        raise RuntimeError("no profiler here")

    with monkeypatch.context() as m:
        m.setattr(autograd_c, "_enable_profiler", refuse)
        broken = ProfileCapture(2, str(tmp_path / "a.json"), cuda=False, ranges_only=True)
        with pytest.raises(ProfilerUnavailable, match="no profiler here"):
            broken.start()
    assert broken.closed.is_set() and broken.done.is_set() and not broken.started.is_set()
    assert not ap._is_profiler_enabled
    # The same process can still capture afterwards.
    ok = ProfileCapture(1, str(tmp_path / "b.json"), cuda=False, ranges_only=True)
    ok.start()
    ok.run(7, lambda: torch.ones(4).sum())
    ok.stop()
    assert ok.error == "" and ok.closed.is_set()
    names = {e.get("name") for e in json.loads((tmp_path / "b.json").read_text())["traceEvents"]}
    assert "netgain_batch_7" in names


def test_profile_refused_without_profile_dir(start_server: ServerLauncher) -> None:
    server = start_server("--model", "null", "--warmup-batches", "1")
    with pytest.raises(grpc.RpcError) as err:
        server.stub().Profile(pb.ProfileRequest(batches=2, ranges_only=True), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--profile-dir" in (err.value.details() or "")
