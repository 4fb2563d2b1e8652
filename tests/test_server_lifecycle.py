"""Integration: servers of their own (health before warm-up, shedding, draining on SIGTERM, the
other models, start-up errors), real ``python -m netgain.server`` processes on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import grpc
import pytest
from conftest import REPO_ROOT, ServerLauncher, server_env
from grpc_helpers import (
    CODE,
    NOT_SERVING,
    assert_full_timing,
    concurrently,
    infer,
    sample_value,
    wait_until,
)

from netgain.loadgen.payloads import PayloadFactory
from netgain.protos import SERVICE_NAME, pb

# Every test here starts a server process.
pytestmark = pytest.mark.slow


# -- servers of their own ------------------------------------------------------------------------------
def slow_args(*extra: str, load_ms: int = 0, forward_ms: int = 0) -> tuple[str, ...]:
    return (
        "--model",
        "conftest:SlowHandler",
        "--handler-option",
        f"load_ms={load_ms}",
        "--handler-option",
        f"forward_ms={forward_ms}",
        "--warmup-batches",
        "0",
        *extra,
    )


def test_health_not_serving_until_warm(start_server: ServerLauncher) -> None:
    server = start_server(*slow_args(load_ms=2500), wait=False)
    server.wait_ports()  # bound and listening, model still loading
    assert server.health() == NOT_SERVING
    assert server.health(SERVICE_NAME) == NOT_SERVING
    stub = server.stub()
    early = infer(stub, [pb.Input(data=b"x")], "early")
    assert early.code == CODE.UNAVAILABLE and "wait for health SERVING" in early.details
    assert_full_timing(early, admitted=False)
    info = stub.ServerInfo(pb.ServerInfoRequest(), timeout=5)
    assert not info.ready
    assert "ready" not in [p.name for p in info.cold_start]
    assert "ready (slow on cpu" not in server.stdout()
    server.wait_serving(30)
    assert infer(stub, [pb.Input(data=b"abc")], "late").code == CODE.OK
    info = stub.ServerInfo(pb.ServerInfoRequest(), timeout=5)
    assert info.ready
    durations = {p.name: p.duration_s for p in info.cold_start}
    assert durations["model_built"] >= 2.4  # the 2.5 s load is in the timeline where it belongs
    assert "ready (slow on cpu" in server.stdout()


def test_full_queue_sheds_with_resource_exhausted(start_server: ServerLauncher) -> None:
    server = start_server(
        *slow_args(
            "--max-queue-size",
            "1",
            "--max-batch-size",
            "1",
            "--pre-threads",
            "1",
            "--max-queue-delay-ms",
            "0",
            forward_ms=300,
        )
    )
    stub = server.stub()
    t0 = time.monotonic()
    replies = concurrently([partial(infer, stub, [pb.Input(data=b"x")], f"shed-{i}") for i in range(10)])
    codes = [r.code for r in replies]
    assert set(codes) <= {CODE.OK, CODE.RESOURCE_EXHAUSTED}, [r.details for r in replies]
    shed = [r for r in replies if r.code == CODE.RESOURCE_EXHAUSTED]
    assert len(shed) >= 5 and codes.count(CODE.OK) >= 2
    for r in shed:
        assert "request queue is full (1 requests waiting)" in r.details and "shed" in r.details
        assert_full_timing(r, admitted=False)  # shed at once, not after waiting for room
    assert time.monotonic() - t0 < 10
    assert infer(stub, [pb.Input(data=b"again")]).code == CODE.OK  # still serving
    wait_until(
        lambda: sample_value(server, "netgain_requests_total", code="RESOURCE_EXHAUSTED") == len(shed),
        what="shed counter",
    )


def test_burst_beyond_grpc_pending_limit_is_shed_not_cancelled(start_server: ServerLauncher) -> None:
    """3,000 calls at once: more than gRPC's default pending-call limit (1,000), which used to reset
    streams (CANCELLED at the client) before the server's own queue could shed them."""
    import asyncio

    server = start_server("--model", "null", "--max-queue-size", "64", "--max-batch-size", "8")
    body = PayloadFactory("null").request_bytes(0, 0, 1)

    async def burst() -> list[str]:
        async with grpc.aio.insecure_channel(server.target) as ch:
            call = ch.unary_unary(f"/{SERVICE_NAME}/Infer")

            async def one() -> str:
                try:
                    await call(body, timeout=60)
                    return "OK"
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name

            return await asyncio.gather(*(one() for _ in range(3000)))

    codes = asyncio.run(burst())
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, {c: codes.count(c) for c in set(codes)}
    assert codes.count("OK") >= 64


def test_sigterm_drains_in_flight_requests(start_server: ServerLauncher) -> None:
    # All 12 must be accepted before the first batch answers: on a loaded 2-core machine sending 12
    # calls from a fresh thread pool has taken longer than a 150 ms forward.
    server = start_server(*slow_args("--max-batch-size", "4", "--max-queue-delay-ms", "5", forward_ms=600))
    stub = server.stub()
    ids = [f"drain-{i}" for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(infer, stub, [pb.Input(data=b"abcd")], rid, "", 30.0) for rid in ids]
        wait_until(lambda: sample_value(server, "netgain_in_flight_requests") == 12, what="12 in flight")
        server.proc.terminate()  # SIGTERM while all 12 are accepted and most still queued
        replies = [f.result(timeout=30) for f in futures]
    assert [r.code for r in replies] == [CODE.OK] * 12, [r.details for r in replies]
    assert all(r.response is not None and r.response.outputs[0].label == 4 for r in replies)
    assert server.proc.wait(20) == 0
    out = server.stdout()
    assert "draining" in out and out.rstrip().endswith("netgain serve: stopped")
    logged = sorted(rec["id"] for rec in server.span_lines() if rec["id"].startswith("drain-"))
    assert logged == sorted(ids)  # span log flushed before exit


def test_text_tabular_null_models_answer(start_server: ServerLauncher) -> None:
    common = ("--warmup-batches", "1", "--intra-op-threads", "1", "--max-queue-delay-ms", "1")
    text = start_server(
        "--model",
        "text",
        *common,
        "--handler-option",
        "layers=1",
        "--handler-option",
        "d_model=64",
        "--handler-option",
        "heads=2",
        "--handler-option",
        "max_len=32",
        wait=False,
    )
    tabular = start_server("--model", "tabular", *common, wait=False)
    null = start_server("--model", "null", *common, wait=False)
    for s in (text, tabular, null):
        s.wait_serving()

    r = infer(text.stub(), [pb.Input(data=b"the model serves a batch"), pb.Input(data="naïve café".encode())])
    assert r.code == CODE.OK and r.response is not None and len(r.response.outputs) == 2
    assert all(0 <= o.label < 2 and 0 < o.score <= 1 for o in r.response.outputs)
    assert_full_timing(r)
    bad = infer(text.stub(), [pb.Input(data=b"\xff\xfe oops")])
    assert bad.code == CODE.INVALID_ARGUMENT and "not valid UTF-8" in bad.details

    r = infer(tabular.stub(), [pb.Input(features=[0.1] * 64)])
    assert r.code == CODE.OK and r.response is not None and 0 <= r.response.outputs[0].label < 10
    bad = infer(tabular.stub(), [pb.Input(features=[0.1] * 3)])
    assert bad.code == CODE.INVALID_ARGUMENT and "expected 64 features, got 3" in bad.details
    assert_full_timing(bad)
    bad = infer(tabular.stub(), [pb.Input(features=[float("nan")] + [0.0] * 63)])
    assert bad.code == CODE.INVALID_ARGUMENT and "feature 0 is nan" in bad.details

    r = infer(null.stub(), [pb.Input(data=b"abc"), pb.Input(data=b"defgh")])
    assert r.code == CODE.OK and r.response is not None
    assert [o.label for o in r.response.outputs] == [3, 5]
    assert r.timing["h2d"] == r.timing["d2h"] == 0
    assert_full_timing(r)
    mismatch = infer(null.stub(), [pb.Input(data=b"x")], model="image")
    assert mismatch.code == CODE.NOT_FOUND and "this server runs 'null'" in mismatch.details


def run_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netgain.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=server_env(),
    )


def test_startup_errors_are_one_line_exit_2() -> None:
    import torch

    cases = [
        (("--model", "resnet"), "unknown model 'resnet'"),
        (("--max-batch-size", "0"), "--max-batch-size must be at least 1"),
        (("--model", "image", "--handler-option", "size=2"), "handler option size=2 is outside"),
    ]
    if not torch.cuda.is_available():
        cases.append((("--device", "cuda"), "CUDA is not available"))
    procs = [(run_cli(*args), message) for args, message in cases]
    try:
        for proc, message in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 2, err
            assert "Traceback" not in err
            lines = err.strip().splitlines()
            assert (
                len(lines) == 1 and lines[0].startswith("netgain serve: error: ") and message in lines[0]
            ), err
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_debug_after_the_flags_shows_the_traceback() -> None:
    proc = run_cli("--model", "resnet", "--debug")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" in err and "unknown model 'resnet'" in err
