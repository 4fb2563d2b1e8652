"""Server faults: a supervisor killed, two servers racing for one port, child processes that die,
oversized Open Inference Protocol tensors, features that overflow the model, metadata over the
advertised header-list size.

Every test starts real ``python -m netgain.server`` processes on 127.0.0.1 and kills, races or
floods them for real; every wait polls a condition with a bound.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from h2raw import DATA, END_HEADERS, END_STREAM, HEADERS, H2Conn, frame, grpc_headers, grpc_message

from netgain.protos import InferenceStub, oip_pb2, pb
from netgain.protos.service import OipStub
from netgain.server.handlers.tabular import TabularHandler
from netgain.server.ports import claim_port, release_claims
from netgain.server.service import MAX_METADATA_BYTES
from netgain.server.threadnames import os_thread_name

MB = 1024 * 1024
CONTINUATION = 9


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(cond: Any, timeout_s: float, interval_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval_s)
    return bool(cond())


def test_a_port_claim_is_exclusive_until_released() -> None:
    """A second claim of a claimed port waits, then fails in one line naming the port; released,
    the port can be claimed again."""
    port = claim_port("127.0.0.1", 0)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    try:
        with pytest.raises(ValueError, match=f"--port {port}: another netgain serve has been starting"):
            claim_port("127.0.0.1", port, wait_s=1.0, clock=lambda: now[0], sleep=sleep)
        assert 0.9 < now[0] < 1.2  # it waited for the claim, polling
    finally:
        release_claims()
    assert claim_port("127.0.0.1", port) == port
    release_claims()


@pytest.mark.parametrize("given", [False, True], ids=["chosen by the kernel", "given"])
def test_a_claimed_port_stays_ours_until_the_frontends_listen(given: bool) -> None:
    """Between the claim and the frontends listening, nothing else may bind the port (a connect()
    would take it as its source port and every frontend fail to bind), while the frontends'
    SO_REUSEPORT gRPC servers can; released, no socket of the claim keeps it."""
    port = claim_port("127.0.0.1", _free_port() if given else 0)
    try:
        with socket.socket() as other, pytest.raises(OSError) as exc:
            other.bind(("127.0.0.1", port))
        assert exc.value.errno == errno.EADDRINUSE

        async def serve_once() -> int:
            server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
            bound = server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            await server.stop(None)
            return bound

        assert asyncio.run(serve_once()) == port
    finally:
        release_claims()
    with socket.socket() as after:
        after.bind(("127.0.0.1", port))


def test_a_port_the_kernel_chose_is_none_this_server_claimed_already(monkeypatch: pytest.MonkeyPatch) -> None:
    """The REST port left to the kernel must not be the gRPC port claimed (not yet listened on) just
    before: a reservation on a taken port is passed over, and closed once another is found."""
    import netgain.server.ports as ports

    offered = [ports.reserve("127.0.0.1"), ports.reserve("127.0.0.1")]
    taken, free = (int(s.getsockname()[1]) for s in offered)
    monkeypatch.setattr(ports, "reserve", lambda host: offered.pop(0))
    first = offered[0]
    try:
        assert claim_port("127.0.0.1", 0, flag="--http-port", taken=(taken,)) == free
        assert first.fileno() == -1  # closed: the passed-over port is not kept
    finally:
        release_claims()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_named(pid: int, name: str) -> psutil.Process:
    """The child whose main thread has the role's name (``netgain-device`` reads ``ng-device``)."""
    for kid in psutil.Process(pid).children():
        if kid.name() == os_thread_name(name):
            return kid
    raise AssertionError(f"no child {name!r} of {pid}: {[k.name() for k in psutil.Process(pid).children()]}")


def _stderr(server: Any) -> str:
    return str((server.workdir / "stderr.txt").read_text(errors="replace"))


# -- the supervisor's children die with it -------------------------------------------------------
@pytest.mark.slow
def test_a_killed_supervisor_takes_every_child_with_it_and_frees_the_port(start_server: Any) -> None:
    """SIGKILL of the supervisor: every frontend, the pre-processing process and the device process
    exit by themselves, and a new server starts on the same port."""
    server = start_server("--model", "null", "--workers", "2", "--pre-processes", "1")
    port = server.grpc_port
    kids = psutil.Process(server.pid).children(recursive=True)
    assert len(kids) == 4, kids  # two frontends, a pre-processing process and the device process
    server.close_channel()
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(10.0)
    killed = time.monotonic()
    assert _wait_until(lambda: all(_gone(k) for k in kids), 15.0), [
        (k.pid, k.name()) for k in kids if not _gone(k)
    ]
    print(f"{len(kids)} children gone {time.monotonic() - killed:.2f} s after the supervisor")
    again = start_server("--model", "null", "--workers", "2", "--port", str(port))
    assert again.grpc_port == port
    assert again.stub().Infer(pb.InferRequest(inputs=[pb.Input(data=b"x")]), timeout=10.0).outputs


@pytest.mark.slow
def test_sigterm_while_the_device_process_is_still_starting_stops_every_process(start_server: Any) -> None:
    """SIGTERM to a supervisor whose device process has not finished loading (its model takes two
    minutes here, as a hung one would take forever): the supervisor does not wait the start-up out,
    it stops every child and exits non-zero within seconds."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--handler-option", "load_ms=120000", "--workers", "2", wait=False
    )  # fmt: skip
    sup = psutil.Process(server.pid)
    assert _wait_until(lambda: len(sup.children()) == 3, 60.0), server.output()  # 2 frontends + device
    assert _wait_until(server.ports_file.exists, 60.0), server.output()  # the frontends listen
    kids = sup.children()
    os.kill(server.pid, signal.SIGTERM)
    assert _wait_until(lambda: server.proc.poll() is not None, 20.0), server.output()
    assert server.proc.returncode != 0
    assert _wait_until(lambda: all(_gone(k) for k in kids), 10.0), [k.pid for k in kids if not _gone(k)]
    assert "stopped by SIGTERM while device process was starting" in _stderr(server)


# -- one port, one server ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("workers", ["2", "0"])
def test_two_servers_started_at_once_on_one_port_one_refuses(start_server: Any, workers: str) -> None:
    """Two servers (``--workers 2``, or one process each) started together on one free port:
    exactly one serves it, the other exits 2 with one line naming the port; every connection
    reaches the one that serves.
    The handler takes 2 s to set up (in the supervisor after its port check, and in each frontend
    before it listens), so both checks fall in the other's window whatever the import times."""
    port = _free_port()
    args = (
        "--model", "conftest:SlowHandler", "--handler-option", "init_ms=2000",
        "--workers", workers, "--port", str(port),
    )  # fmt: skip
    a, b = start_server(*args, wait=False), start_server(*args, wait=False)
    assert _wait_until(lambda: a.proc.poll() is not None or b.proc.poll() is not None, 90.0, 0.05), (
        "both servers are still running: " + a.output() + b.output()
    )
    loser, winner = (a, b) if a.proc.poll() is not None else (b, a)
    assert loser.proc.returncode == 2, loser.output()
    lines = [line for line in _stderr(loser).splitlines() if line.strip()]
    assert len(lines) == 1 and f"{port}" in lines[0] and "already in use" in lines[0], lines
    winner.wait_serving()
    pids = set()
    for _ in range(8):  # fresh connections: the kernel would spread them over both servers' sockets
        with grpc.insecure_channel(winner.target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            pids.add(InferenceStub(ch).ServerInfo(pb.ServerInfoRequest(), timeout=10.0).pid)
    assert pids == {winner.pid}


# -- a child that dies is named rightly ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_device_process_killed_by_a_signal_is_reported_with_the_signal(start_server: Any, sig: int) -> None:
    """The supervisor says which signal ended the device process, and stops with status 1."""
    server = start_server("--model", "null", "--workers", "1")
    device = _child_named(server.pid, "netgain-device")
    os.kill(device.pid, sig)
    server.proc.wait(60.0)
    err = _stderr(server)
    assert f"the device process (pid {device.pid}) exited (killed by {signal.Signals(sig).name})" in err, err
    assert "status None" not in err
    assert server.proc.returncode == 1


@pytest.mark.slow
def test_a_pre_processing_process_that_dies_is_named_as_such(start_server: Any, tmp_path: Path) -> None:
    """A pre-processing process killed while it pre-processes a request: the client is told which
    process died (not a frontend), with UNAVAILABLE at once."""
    mark = tmp_path / "pre-started"
    server = start_server(
        "--model", "conftest:SlowHandler", "--workers", "1", "--pre-processes", "1",
        "--handler-option", "pre_ms=60000", "--handler-option", f"pre_mark={mark}",
    )  # fmt: skip
    pre = _child_named(server.pid, "netgain-pre-1")
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            server.stub().Infer(pb.InferRequest(inputs=[pb.Input(data=b"slow")]), timeout=50.0)
        except grpc.RpcError as exc:
            out["error"] = exc

    t = threading.Thread(target=call)
    t.start()
    assert _wait_until(mark.exists, 30.0, 0.02), server.output()
    pre.kill()
    t.join(30.0)
    err = out["error"]
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "pre-processing process 1 exited while pre-processing" in (err.details() or ""), err.details()


# -- Open Inference Protocol tensors: counted before materialised ---------------------------------
def _oip_request(shape: list[int], raw: bytes | None = None, bytes_contents: int = 0) -> Any:
    req = oip_pb2.ModelInferRequest(model_name="null")
    t = req.inputs.add(name="INPUT", datatype="BYTES", shape=shape)
    if bytes_contents:
        t.contents.bytes_contents.extend([b""] * bytes_contents)
    if raw is not None:
        req.raw_input_contents.append(raw)
    return req


def _refused(stub: Any, req: Any) -> tuple[Any, str, float]:
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(req, timeout=60.0)
    return err.value.code(), err.value.details() or "", time.monotonic() - t0


@pytest.mark.slow
def test_oip_millions_of_empty_elements_are_refused_without_materialising_them(start_server: Any) -> None:
    """A 12 MB tensor of 3,000,000 zero-length BYTES elements (raw), 2,000,000 empty
    ``bytes_contents``, and a shape that understates its raw data: each refused with
    INVALID_ARGUMENT before one Python object per element exists (the server's RSS grows by far less
    than the 1.4 GB those objects took); a normal request right after is served."""
    server = start_server("--model", "null")
    stub = OipStub(server.channel)
    proc = psutil.Process(server.pid)
    assert stub.ModelInfer(
        _oip_request([1], bytes_contents=0, raw=b"\x01\x00\x00\x00x"), timeout=10.0
    ).outputs
    rss0 = proc.memory_info().rss
    cases = [
        (
            _oip_request([3_000_000], raw=b"\x00" * 12_000_000),
            "request has 3000000 inputs, over the limit of 256",
        ),
        (
            _oip_request([2_000_000], bytes_contents=2_000_000),
            "request has 2000000 inputs, over the limit of 256",
        ),
        (_oip_request([1], raw=b"\x00" * 12_000_000), "holds more than the 1 elements of its shape"),
    ]
    for req, expect in cases:
        before = proc.memory_info().rss
        code, details, took = _refused(stub, req)
        grown = (proc.memory_info().rss - before) / MB
        print(f"{expect[:40]!r}: {code.name} in {took:.2f} s, RSS +{grown:.0f} MB")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert expect in details, details
        # The 12 MB message itself is buffered and parsed (a few copies); per-element objects were 1.4 GB.
        assert grown < 200, f"RSS grew {grown:.0f} MB"
    assert (proc.memory_info().rss - rss0) / MB < 400
    assert stub.ModelInfer(_oip_request([1], raw=b"\x01\x00\x00\x00x"), timeout=10.0).outputs


@pytest.mark.slow
def test_oip_tensor_with_both_contents_and_raw_contents_is_invalid(start_server: Any) -> None:
    """The protocol forbids a tensor carried twice: INVALID_ARGUMENT, not a silent choice."""
    server = start_server("--model", "null")
    req = _oip_request([1], raw=b"\x01\x00\x00\x00x")
    req.inputs[0].contents.bytes_contents.append(b"y")
    code, details, _ = _refused(OipStub(server.channel), req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "both contents and raw_input_contents" in details


# -- tabular features beyond what the model keeps finite -----------------------------------------
@pytest.mark.slow
def test_tabular_features_that_would_overflow_the_model_are_invalid_and_named(start_server: Any) -> None:
    """+-3.4e38 (finite float32) is refused with INVALID_ARGUMENT naming the feature; the largest
    magnitude the handler accepts gives a finite score."""
    server = start_server("--model", "tabular", "--handler-option", "features=16")
    stub = server.stub()
    features = [0.5] * 16
    features[5] = -3.4e38
    with pytest.raises(grpc.RpcError) as err:
        stub.Infer(pb.InferRequest(inputs=[pb.Input(features=features)]), timeout=30.0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "feature 5 is -3.4e+38" in (err.value.details() or ""), err.value.details()
    edge = TabularHandler({"features": "16"}).max_abs * 0.999
    ok = stub.Infer(pb.InferRequest(inputs=[pb.Input(features=[edge, -edge] * 8)]), timeout=30.0)
    score = ok.outputs[0].score
    assert score == score and 0.0 < score <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_non_finite_output_fails_its_request_only_with_invalid_argument(
    start_server: Any, workers: str
) -> None:
    """Post-processing that finds NaN or infinity fails that request with INVALID_ARGUMENT (one
    process and --workers alike); the other request of the same call's batch is answered."""
    server = start_server(
        "--model", "conftest:SlowHandler", "--workers", workers, "--max-queue-delay-ms", "50"
    )
    stub = server.stub()
    nan = stub.Infer.future(pb.InferRequest(inputs=[pb.Input(data=b"nan")]), timeout=30.0)
    ok = stub.Infer.future(pb.InferRequest(inputs=[pb.Input(data=b"four")]), timeout=30.0)
    assert ok.result().outputs[0].label == 4
    with pytest.raises(grpc.RpcError) as err:
        nan.result()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not finite" in (err.value.details() or "")


# -- metadata over the advertised header-list size ------------------------------------------------
def _send_headers(conn: H2Conn, stream: int, block: bytes) -> None:
    """A header block as HEADERS plus CONTINUATION frames (16,000 bytes each)."""
    chunks = [block[i : i + 16_000] for i in range(0, len(block), 16_000)]
    for i, chunk in enumerate(chunks):
        last = END_HEADERS if i == len(chunks) - 1 else 0
        conn.sock.sendall(frame(HEADERS if i == 0 else CONTINUATION, last, stream, chunk))


@pytest.mark.slow
def test_metadata_over_the_advertised_size_is_refused_without_a_settings_ack(start_server: Any) -> None:
    """A client that never acknowledges the server's SETTINGS sends 40 KB of metadata: refused
    with RESOURCE_EXHAUSTED before the request is served; the same request with small metadata is
    served on the same connection."""
    server = start_server("--model", "null")
    port = server.grpc_port
    body = grpc_message(pb.InferRequest(inputs=[pb.Input(data=b"x")]).SerializeToString())
    conn = H2Conn(port)  # sends the preface and its own SETTINGS; never reads or acks the server's
    try:
        big = grpc_headers(port, "/netgain.v1.Inference/Infer", [(b"x-big", b"a" * 40_000)])
        assert len(big) > MAX_METADATA_BYTES
        _send_headers(conn, 1, big)
        conn.sock.sendall(frame(DATA, END_STREAM, 1, body))
        _send_headers(conn, 3, grpc_headers(port, "/netgain.v1.Inference/Infer"))
        conn.sock.sendall(frame(DATA, END_STREAM, 3, body))
        end = time.monotonic() + 15.0
        while time.monotonic() < end and not (conn.stream_ended(1) and conn.stream_ended(3)):
            f = conn._read_frame(0.2)
            if f is not None:
                conn.frames.append(f)
        refused, served = b"".join(conn.headers_of(1)), b"".join(conn.headers_of(3))
    finally:
        conn.close()
    assert b"grpc-status\x018" in refused, refused  # RESOURCE_EXHAUSTED
    assert b"header-list size" in refused
    assert b"grpc-status\x010" in served, served
