"""A worker beyond the master's --remote-workers (compose's --scale above NETGAIN_REMOTE_WORKERS)
says so in one line and exits non-zero, never idles to exit 0 as if it had taken part."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ServerLauncher, netgain_cmd, server_env

SURPLUS_EXIT = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:``port`` (``proc`` still running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"exited with {proc.returncode} before listening"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port} after {timeout_s:.0f} s"
            time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_beyond_the_expected_ones_says_so_and_exits_non_zero(
    start_server: ServerLauncher, tmp_path: Path
) -> None:
    server = start_server("--model", "null")
    port = _free_port()

    def popen(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            netgain_cmd(*args), env=server_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    # A send-lag limit no loaded 2-core host misses: the run's validity is not what this is about.
    master = popen(
        "load", "--target", f"127.0.0.1:{server.grpc_port}", "--rate", "20", "--duration", "2",
        "--workers", "0", "--remote-workers", "1", "--master-bind-port", str(port),
        "--max-send-lag-ms", "10000", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    _wait_listening(port, master)
    workers = [
        popen("load", "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)) for _ in range(2)
    ]
    try:
        outs = [w.communicate(timeout=90) for w in workers]
        m_out, m_err = master.communicate(timeout=90)
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
    assert master.returncode == 0, (m_out[-2000:], m_err[-2000:])
    assert "Traceback" not in m_err
    codes = sorted(w.returncode for w in workers)
    assert codes == [0, SURPLUS_EXIT], (codes, [e[-1000:] for _, e in outs])
    surplus_err = next(e for w, (_, e) in zip(workers, outs, strict=True) if w.returncode == SURPLUS_EXIT)
    lines = [ln for ln in surplus_err.splitlines() if "surplus" in ln]
    assert len(lines) == 1 and "expects 1 worker(s)" in lines[0] and "NETGAIN_REMOTE_WORKERS" in lines[0]
    assert "beyond the 1 expected" in m_err
