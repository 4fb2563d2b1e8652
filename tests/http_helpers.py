"""Helpers shared by the ``netgain load --protocol http-json`` tests: start a JSON service script
(tests/http_app.py, tests/fastapi_app.py) in its own process, write a request template, run a small
bounded load against it and read back one row per scheduled request."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import HOST, read_meta, read_rows, run_netgain, server_env

# Small and bounded: about 130 requests a run, 1 s of it warm-up; the shared machine's send lag is
# not what these tests check.
LOAD_FLAGS = (
    "--rate", "40", "--duration", "2.5", "--warmup-s", "1", "--arrival", "constant",
    "--max-send-lag-ms", "200", "--timeout-s", "10", "--quiet",
)  # fmt: skip


class App:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc, self.port = proc, port

    @property
    def target(self) -> str:
        return f"{HOST}:{self.port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.target}{path}", timeout=5.0) as resp:
            return json.loads(resp.read())


@contextlib.contextmanager
def serve_app(script: Path, max_seconds: float = 300.0) -> Iterator[App]:
    """Run ``script --max-seconds S`` until the block ends (SIGTERM, then SIGKILL)."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--max-seconds", str(max_seconds)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=server_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the app prints its port once bound, or exits
        assert line.startswith("PORT "), f"the HTTP app did not start: {line!r}"
        yield App(proc, int(line.split()[1]))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10.0)


def write_template(tmp_path: Path, **doc: Any) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(doc))
    return str(path)


def load_http_json(target: str, out: Path, template: str, *extra: str, model: str = "image") -> Any:
    return run_netgain(
        "load", "--target", target, "--protocol", "http-json", "--request-template", template,
        "--model", model, "--out", str(out), *LOAD_FLAGS, *extra,
    )  # fmt: skip


def one_row_each(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    meta, rows = read_meta(out), read_rows(out)
    n = meta["trace"]["requests"]
    assert n == meta["counts"]["scheduled"] > 0
    assert sorted(rows["index"].tolist()) == list(range(n))  # exactly one row per scheduled request
    return meta, rows


def report_blames_kernel(out: Path) -> dict[str, Any]:
    """``netgain report`` on a run whose service slept 40 ms in "kernel" for every twentieth
    request: those are the tail and their excess is the kernel's, as the service's Server-Timing
    says. Returns report.json."""
    report = run_netgain("report", str(out))
    assert report.returncode == 0, report.stderr + report.stdout
    summary: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert summary["tail"]["dominant"] == "kernel"
    assert summary["tail"]["p99"]["phases"]["kernel"]["excess_ms"] > 30.0
    assert summary["phases_ms"]["kernel"]["p99"] >= 40.0
    assert not any("no server-timing trailer" in g for g in summary["attribution_gaps"])
    return summary
