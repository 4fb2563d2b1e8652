"""`netgain load --protocol oip` (KServe v2 gRPC) and `--protocol oip-http` (KServe v2 REST) against a
real Triton Inference Server (2.51, as bundled by nvidia-pytriton 0.7.0), not netgain's own OIP
service: the probe reads Triton's model metadata, the load generator's requests are served by
Triton, every scheduled request gets a row, and the report names the attributions it cannot make
without netgain's trailers.

Triton runs from a separate virtualenv (nvidia-pytriton pins numpy<2 and tritonclient~=2.50), whose
interpreter NETGAIN_TRITON_PYTHON names; tests/triton_server.py is the server it runs. Locally:

    python3 -m venv /path/to/v && /path/to/v/bin/pip install 'nvidia-pytriton==0.7.0'
    NETGAIN_TRITON_PYTHON=/path/to/v/bin/python python -m pytest -q tests/test_oip_triton.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HOST, TESTS_DIR, read_meta, read_rows, run_netgain

pytestmark = pytest.mark.slow

ENV_VAR = "NETGAIN_TRITON_PYTHON"
INSTALL = "python3 -m venv V && V/bin/pip install 'nvidia-pytriton==0.7.0'"
SERVER_SCRIPT = TESTS_DIR / "triton_server.py"
MODELS = ("null", "image_jpeg", "tabular_sum", "fail")
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 40.0
# A safety net only: the fixture stops the server long before this.
MAX_SERVER_S = 900
# Small and bounded: about 90 requests a run, 1 s of it warm-up.
LOAD_FLAGS = (
    "--rate", "30", "--duration", "2", "--warmup-s", "1", "--arrival", "constant", "--items", "1:0.5,3:0.5",
    "--max-send-lag-ms", "200", "--timeout-s", "10", "--quiet",
)  # fmt: skip


def _triton_python() -> tuple[str | None, str]:
    """The interpreter that can run PyTriton, or None and why not (one line)."""
    python = os.environ.get(ENV_VAR, "")
    if not python:
        return (
            None,
            f"{ENV_VAR} is unset: set it to the python of a virtualenv with nvidia-pytriton ({INSTALL})",
        )
    try:
        probe = subprocess.run(
            [python, "-c", "import pytriton"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{ENV_VAR}={python} cannot run: {exc} ({INSTALL})"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{ENV_VAR}={python} cannot import pytriton ({last}); {INSTALL}"
    return python, ""


def _free_ports(n: int) -> list[int]:
    """Ports free on 127.0.0.1 now (bound, read, closed): pytriton takes explicit ports."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Triton:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    metrics_port: int
    log: Path

    @property
    def target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def target_for(self, protocol: str) -> str:
        return f"{HOST}:{self.http_port if protocol == 'oip-http' else self.grpc_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def counter(self, name: str, model: str) -> float:
        """Triton's own count for ``model`` (its Prometheus metrics), to check the rows against."""
        url = f"http://{HOST}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5.0) as resp:
            text = resp.read().decode("utf-8")
        prefix = f'{name}{{model="{model}",'
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the script stops tritonserver), then SIGKILL to its whole process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # tritonserver and its backend stubs, if any are left
    proc.wait(10.0)


def _wait_ready(triton: Triton) -> None:
    import tritonclient.grpc as tc

    deadline = time.monotonic() + START_TIMEOUT_S
    client = tc.InferenceServerClient(url=triton.target)
    try:
        while True:
            if triton.proc.poll() is not None:
                raise RuntimeError(f"Triton exited with {triton.proc.returncode}:\n{triton.output()}")
            try:
                if client.is_server_ready() and all(client.is_model_ready(m) for m in MODELS):
                    return
            except Exception:  # tritonclient raises its own error while nothing listens yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Triton not ready after {START_TIMEOUT_S:.0f} s:\n{triton.output()}")
            time.sleep(0.5)
    finally:
        client.close()


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Triton]:
    python, why = _triton_python()
    if python is None:
        pytest.skip(why)
    grpc_port, http_port, metrics_port = _free_ports(3)
    log = tmp_path_factory.mktemp("triton") / "triton.log"
    cmd = [python, str(SERVER_SCRIPT), str(grpc_port), str(http_port), str(metrics_port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*cmd, "--max-seconds", str(MAX_SERVER_S)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, for the SIGKILL of last resort
        )
    server = Triton(proc, grpc_port, http_port, metrics_port, log)
    try:
        _wait_ready(server)
        yield server
    finally:
        _stop(proc)


def _load(triton: Triton, out: Path, oip_model: str, model: str, *extra: str, protocol: str = "oip") -> Any:
    return run_netgain(
        "load", "--target", triton.target_for(protocol), "--protocol", protocol, "--oip-model", oip_model,
        "--model", model, "--out", str(out), *LOAD_FLAGS, *extra,
    )  # fmt: skip


def _one_row_each(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    meta, rows = read_meta(out), read_rows(out)
    n = meta["trace"]["requests"]
    assert n == meta["counts"]["scheduled"] > 0
    assert sorted(rows["index"].tolist()) == list(range(n))  # exactly one row per scheduled request
    return meta, rows


PROTOCOLS = pytest.mark.parametrize("protocol", ["oip", "oip-http"])


@PROTOCOLS
@pytest.mark.parametrize(
    ("oip_model", "model"), [("null", "null"), ("image_jpeg", "image"), ("tabular_sum", "tabular")]
)
def test_load_against_triton(
    triton: Triton, tmp_path: Path, oip_model: str, model: str, protocol: str
) -> None:
    before = triton.counter("nv_inference_request_success", oip_model)
    out = tmp_path / "run"
    load = _load(triton, out, oip_model, model, protocol=protocol)
    assert load.returncode == 0, load.stderr + load.stdout
    meta, rows = _one_row_each(out)
    assert set(rows["status"].tolist()) == {"OK"}
    assert set(rows["items"].tolist()) == {1, 3}  # both batch shapes Triton accepted
    latency, service = rows["done_ns"] - rows["scheduled_ns"], rows["done_ns"] - rows["sent_ns"]
    assert (service > 0).all() and (latency >= service).all()
    assert (rows["response_bytes"] > 0).all()
    assert np.isnan(rows["server_total_ms"].astype(float)).all()  # Triton sends no server-timing trailer
    if protocol == "oip-http":
        assert set(rows["http_status"].tolist()) == {200}
    else:
        assert np.isnan(rows["http_status"].astype(float)).all()
    # Triton's own counter saw each request the rows call OK, no more and no fewer.
    assert triton.counter("nv_inference_request_success", oip_model) - before == len(rows["status"])
    cfg = meta["config"]
    assert cfg["protocol"] == protocol and cfg["oip_model"] == oip_model
    assert cfg["targets"] == [triton.target_for(protocol)]
    assert meta["server"]["model"] == oip_model and meta["server"]["versions"]["platform"] == "python"
    assert meta["validity"]["valid"] is True

    report = run_netgain("report", str(out))
    assert report.returncode == 0, report.stderr + report.stdout
    summary = json.loads((out / "report.json").read_text())
    gaps = summary["attribution_gaps"]
    n_ok = int((~rows["warmup"]).sum())
    assert any(f"no server-timing trailer on {n_ok} of {n_ok} successful requests" in g for g in gaps)
    assert any(f"from the {protocol} target (platform python)" in g for g in gaps)
    assert any(g.startswith("batch sizes are unknown without the trailer") for g in gaps)
    assert any(g.startswith("an Open Inference Protocol run reads no ServerInfo") for g in gaps)
    for gap in gaps:  # and says so in the text report, as warnings
        assert f"warning: {gap}" in report.stdout


@PROTOCOLS
def test_model_triton_fails(triton: Triton, tmp_path: Path, protocol: str) -> None:
    """Every request fails in the model: each row carries Triton's code (INTERNAL; over REST, its
    HTTP 500 and message); the run is a valid measurement of a failing target, so it exits 5
    (REQUESTS FAILED ... none succeeded)."""
    before = triton.counter("nv_inference_request_failure", "fail")
    out = tmp_path / "run"
    load = _load(triton, out, "fail", "null", protocol=protocol)
    assert load.returncode == 5, load.stderr + load.stdout
    meta, rows = _one_row_each(out)
    assert set(rows["status"].tolist()) == {"INTERNAL"}
    reason = "Failed to process the request(s) for model 'fail_0_0'"
    if protocol == "oip-http":
        assert set(rows["http_status"].tolist()) == {500}
        reason = "HTTP 500: " + reason
    assert all(e.startswith(reason) and "the fail model fails every request" in e for e in rows["error"])
    assert triton.counter("nv_inference_request_failure", "fail") - before == len(rows["status"])
    n = len(rows["status"])
    assert meta["counts"]["ok"] == 0 and meta["counts"]["errors"] == n
    assert meta["validity"]["valid"] is True and not meta["validity"]["reasons"]
    assert f"run: ok 0 errors {n} dropped 0" in load.stdout
    last = load.stdout.strip().splitlines()[-1]
    assert last.startswith("netgain load: REQUESTS FAILED") and last.endswith("INTERNAL); none succeeded"), (
        last
    )


@PROTOCOLS
def test_model_triton_lacks(triton: Triton, tmp_path: Path, protocol: str) -> None:
    """A model Triton does not serve: the probe refuses it before any load (Triton answers its
    metadata NOT_FOUND, over REST 404), with one line naming the model and the flag, exit 2; nothing
    is written."""
    out = tmp_path / "run"
    load = _load(triton, out, "resnet50", "image", "--wait-ready-s", "1", protocol=protocol)
    assert load.returncode == 2, load.stderr + load.stdout
    target = triton.target_for(protocol)
    assert f"target {target} has no ready Open Inference Protocol model 'resnet50'" in load.stderr
    assert "--oip-model names it" in load.stderr
    assert not (out / "meta.json").exists() and not (out / "requests.parquet").exists()
