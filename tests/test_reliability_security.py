"""Security properties of `netgain serve`: loopback by default, TLS and mTLS, message-size limits,
handlers only from an explicit module:Class, no request data in metric labels, request ids
validated. Certificates are made in the test with the `cryptography` package.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from conftest import server_env
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from reliability_helpers import REPO_ROOT, run_load, wait_for_counts

from netgain.protos import InferenceStub, pb

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

pytestmark = pytest.mark.slow


# -- loopback by default -----------------------------------------------------------------------
def _ipv4(ip: str) -> str:
    """gRPC may listen on a dual-stack socket: ``::ffff:127.0.0.1`` is 127.0.0.1 (``::`` is not)."""
    addr = ipaddress.ip_address(ip)
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return str(mapped) if mapped is not None else str(addr)


def test_server_binds_loopback_when_no_host_is_given(tmp_path: Path) -> None:
    ports_file = tmp_path / "ports.json"
    cmd = [
        sys.executable,
        "-m",
        "netgain.server",
        "--model",
        "null",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--ports-file",
        str(ports_file),
    ]  # no --host
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=server_env(),
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while not ports_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        listening = [
            c for c in psutil.Process(proc.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]
        by_port = {c.laddr.port: _ipv4(c.laddr.ip) for c in listening}
        assert by_port.get(ports["grpc"]) == "127.0.0.1", listening
        assert by_port.get(ports["metrics"]) == "127.0.0.1", listening
        assert by_port.get(ports["http"]) == "127.0.0.1", listening
        assert all(ipaddress.ip_address(_ipv4(c.laddr.ip)).is_loopback for c in listening), listening
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# -- TLS and mTLS ------------------------------------------------------------------------------
def _name(cn: str) -> Any:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: Any, issuer: str, issuer_key: Any, ca: bool, san: bool = False) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, srv_key, cli_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("netgain-test-ca", ca_key, "netgain-test-ca", ca_key, ca=True)
    srv = _cert("localhost", srv_key, "netgain-test-ca", ca_key, ca=False, san=True)
    cli = _cert("netgain-client", cli_key, "netgain-test-ca", ca_key, ca=False)
    files = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "server": srv.public_bytes(serialization.Encoding.PEM),
        "server_key": _pem_key(srv_key),
        "client": cli.public_bytes(serialization.Encoding.PEM),
        "client_key": _pem_key(cli_key),
    }
    out = {}
    for name, data in files.items():
        (d / f"{name}.pem").write_bytes(data)
        out[name] = d / f"{name}.pem"
    return out


def _wait_serving(channel: grpc.Channel, server: Any, timeout_s: float = 90.0) -> None:
    server.wait_ports(timeout_s)
    deadline = time.monotonic() + timeout_s
    stub = health_pb2_grpc.HealthStub(channel)
    while True:
        server._check_alive()
        try:
            if (
                stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status
                == health_pb2.HealthCheckResponse.SERVING
            ):
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.1)


def _infer(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        InferenceStub(channel).Infer(pb.InferRequest(inputs=[pb.Input(data=b"x")]), timeout=5.0)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def _tls_channel(target: str, pki: dict[str, Path], client_cert: bool) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client_key"].read_bytes() if client_cert else None,
        certificate_chain=pki["client"].read_bytes() if client_cert else None,
    )
    return grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "localhost")])


def _https_ready(server: Any, pki: dict[str, Path], client_cert: bool, tls: bool = True) -> int:
    """GET /v2/health/ready on the REST port (--http-port): its status, or 0 when refused."""
    port = json.loads(server.ports_file.read_text())["http"]
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if client_cert:
        ctx.load_cert_chain(str(pki["client"]), str(pki["client_key"]))
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, context=ctx if tls else None, timeout=10.0) as resp:
            return int(resp.status)
    except (http.client.HTTPException, OSError):  # URLError and ssl.SSLError are OSErrors
        return 0


def test_tls_serves_tls_clients_and_refuses_plaintext(
    start_server: Any, pki: dict[str, Path], tmp_path: Path
) -> None:
    server = start_server(
        "--model", "null", "--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"]),
        "--http-port", "0", wait=False,
    )  # fmt: skip
    server.wait_ports()
    tls = _tls_channel(server.target, pki, client_cert=False)
    plain = grpc.insecure_channel(server.target)
    try:
        _wait_serving(tls, server)
        assert _infer(tls) == grpc.StatusCode.OK
        assert _infer(plain) == grpc.StatusCode.UNAVAILABLE
        assert _infer(tls) == grpc.StatusCode.OK  # the plaintext attempt did no harm
        # the REST endpoint serves the same certificate, and no plaintext either
        assert _https_ready(server, pki, client_cert=False) == 200
        assert _https_ready(server, pki, client_cert=False, tls=False) == 0
        assert _https_ready(server, pki, client_cert=False) == 200
    finally:
        tls.close()
        plain.close()
    # The load generator verifies the server against --tls-ca (the certificate names 127.0.0.1).
    out = tmp_path / "run"
    res = run_load(
        server_env(),
        "--target",
        server.target,
        "--tls-ca",
        str(pki["ca"]),
        "--rate",
        "20",
        "--duration",
        "1",
        "--warmup-s",
        "0",
        "--out",
        str(out),
        "--quiet",
        "--max-send-lag-ms",
        "1000",
    )
    assert res.returncode == 0, res.stderr + res.stdout
    counts = json.loads((out / "meta.json").read_text())["counts"]
    assert counts["ok"] == counts["scheduled"] > 0


def test_mtls_requires_a_client_certificate(start_server: Any, pki: dict[str, Path], tmp_path: Path) -> None:
    server = start_server(
        "--model",
        "null",
        "--tls-cert",
        str(pki["server"]),
        "--tls-key",
        str(pki["server_key"]),
        "--tls-client-ca",
        str(pki["ca"]),
        "--http-port",
        "0",
        wait=False,
    )
    server.wait_ports()
    with_cert = _tls_channel(server.target, pki, client_cert=True)
    without = _tls_channel(server.target, pki, client_cert=False)
    plain = grpc.insecure_channel(server.target)
    try:
        _wait_serving(with_cert, server)
        assert _infer(with_cert) == grpc.StatusCode.OK
        assert _infer(without) == grpc.StatusCode.UNAVAILABLE  # handshake refused
        assert _infer(plain) == grpc.StatusCode.UNAVAILABLE
        assert _infer(with_cert) == grpc.StatusCode.OK
        assert _https_ready(server, pki, client_cert=True) == 200
        assert _https_ready(server, pki, client_cert=False) == 0  # REST requires the certificate too
    finally:
        for ch in (with_cert, without, plain):
            ch.close()


# -- message size --------------------------------------------------------------------------------
def test_message_over_the_limit_is_refused_and_the_server_stays_up(start_server: Any) -> None:
    server = start_server("--model", "null", "--max-message-mb", "1")
    stub = server.stub()
    big = pb.InferRequest(inputs=[pb.Input(data=b"\x00" * (1024 * 1024 + 1))])
    with pytest.raises(grpc.RpcError) as err:
        stub.Infer(big, timeout=10.0)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details()
    ok = stub.Infer(pb.InferRequest(inputs=[pb.Input(data=b"\x00" * (900 * 1024))]), timeout=10.0)
    assert len(ok.outputs) == 1
    assert server.proc.poll() is None


# -- handlers only from an explicit module:Class ---------------------------------------------------
def _serve_exit(tmp_path: Path, model: str) -> subprocess.CompletedProcess[str]:
    env = server_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-m", "netgain.server", "--model", model, "--port", "0", "--metrics-port", "-1"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=REPO_ROOT,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_handlers_load_only_from_an_explicit_module_class(tmp_path: Path) -> None:
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil_handler.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    for bare in ("evil_handler", "resnet", "os"):
        res = _serve_exit(tmp_path, bare)
        assert res.returncode == 2, res
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"unknown model {bare!r}" in lines[0] and "module:Class" in lines[0], lines
        assert "Traceback" not in res.stderr
    assert not marker.exists(), "a bare name imported a module"
    res = _serve_exit(tmp_path, "os:path")  # explicit, but not a Handler
    assert res.returncode == 2 and "is not a subclass of netgain.server.handlers.Handler" in res.stderr


# -- no request data in metric labels; request ids validated --------------------------------------
SECRET_ID = "client-secret-id-7f3a9c"
SECRET_PAYLOAD = b"PAYLOAD-MARKER-5b1e"


def _label_values(text: str, openmetrics: bool) -> set[str]:
    fams = om_families(text) if openmetrics else text_string_to_metric_families(text)
    return {str(v) for fam in fams for s in fam.samples for v in s.labels.values()}


def test_no_request_data_in_metric_labels_and_ids_are_validated(start_server: Any) -> None:
    server = start_server("--model", "null", "--max-items-per-request", "4")
    stub = server.stub()
    req = pb.InferRequest(model="", inputs=[pb.Input(data=SECRET_PAYLOAD)])
    for i in range(20):
        stub.Infer(req, metadata=(("x-request-id", f"{SECRET_ID}-{i}"),), timeout=5.0)
    for bad in (
        pb.InferRequest(model="model-" + SECRET_ID, inputs=[pb.Input(data=SECRET_PAYLOAD)]),
        pb.InferRequest(inputs=[pb.Input(data=SECRET_PAYLOAD)] * 5),
    ):
        with pytest.raises(grpc.RpcError):
            stub.Infer(bad, metadata=(("x-request-id", SECRET_ID + "-bad"),), timeout=5.0)
    # Invalid ids: refused with INVALID_ARGUMENT before use, never echoed or logged.
    invalid = ["x" * 129, "has space", "slash/inside", "<script>", "semi;colon", "quote'", "percent%41", "é"]
    seen_ids = set()
    for rid in invalid:
        try:
            call = stub.Infer.with_call(req, metadata=(("x-request-id", rid),), timeout=5.0)
            raise AssertionError(f"id {rid!r} was accepted: {call}")
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.INTERNAL and err.details() == "Invalid metadata":
                continue  # non-ASCII: the client library refuses to send it at all
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (rid, err)
            assert "x-request-id" in (err.details() or "")
            metadata: Any = err.trailing_metadata() or ()
            trailing: dict[str, Any] = dict(metadata)
            seen_ids.add(trailing.get("x-request-id"))
    assert seen_ids <= {"invalid", None}
    # A valid id of the maximum length is accepted and echoed.
    ok_id = "a.B_c:9-" * 16
    _, call = stub.Infer.with_call(req, metadata=(("x-request-id", ok_id),), timeout=5.0)
    assert dict(call.trailing_metadata())["x-request-id"] == ok_id
    # The recorder drains in order: once the last request (ok_id) is counted, every earlier one is too.
    got = wait_for_counts(server.metrics_text, {"OK": 21})
    assert got.get("OK", 0.0) >= 21, got
    for om in (False, True):
        text = server.metrics_text(openmetrics=om)
        labels = _label_values(text, om)
        assert labels, "no labels parsed"
        leaked = [
            v
            for v in labels
            if SECRET_ID in v
            or SECRET_PAYLOAD.decode() in v
            or ok_id in v
            or any(rid in v for rid in invalid[1:])
        ]
        assert not leaked, leaked
    lines = server.span_lines()
    assert not any(rid in json.dumps(s) for s in lines for rid in invalid[1:-1])
