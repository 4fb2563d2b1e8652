"""What a user's own commands promise: one meaning per environment variable in every subcommand,
`netgain load` refusing a port that is not gRPC at once, and `netgain report` naming a damaged
requests.parquet in one line."""

from __future__ import annotations

import argparse
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from analysis_fixtures import make_run
from conftest import run_netgain as netgain

from netgain.cli import build_parser
from netgain.cli.args import COMMANDS, command_of


def _subparsers(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in {id(v): v for v in a.choices.values()}.values():
                yield sp
                yield from _subparsers(sp)


def test_every_subcommand_is_known_so_its_per_command_flags_read_their_own_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each subcommand has a name of its own for the per-command variables; `netgain tune` reads
    NETGAIN_TUNE_MODEL, never a bare NETGAIN_MODEL or NETGAIN_OUT set for another command."""
    for sp in _subparsers(build_parser()):
        assert command_of(sp.prog), f"{sp.prog}: not in netgain.cli.args.COMMANDS {COMMANDS}"
    monkeypatch.setenv("NETGAIN_MODEL", "text")
    monkeypatch.setenv("NETGAIN_OUT", "runs/elsewhere")
    tune = build_parser().parse_args(["tune"])
    assert tune.model == "image" and tune.out != "runs/elsewhere"
    assert any("NETGAIN_MODEL is not read" in w for w in tune._env_warnings)
    monkeypatch.setenv("NETGAIN_TUNE_MODEL", "tabular")
    assert build_parser().parse_args(["tune"]).model == "tabular"


@pytest.fixture
def http_port() -> Iterator[int]:
    """An HTTP/1 server on 127.0.0.1 (what a /metrics port is)."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield int(srv.server_port)
    finally:
        srv.shutdown()
        srv.server_close()


def test_load_at_a_port_that_is_not_grpc_fails_at_once(http_port: int, tmp_path: Path) -> None:
    """`netgain load --target` at an HTTP/1 port says "not a gRPC server" in one line and exit 2,
    without waiting out --wait-ready-s."""
    start = time.monotonic()
    res = netgain(
        "load", "--target", f"127.0.0.1:{http_port}", "--wait-ready-s", "60", "--out", str(tmp_path / "r"),
        timeout=60.0,
    )  # fmt: skip
    took = time.monotonic() - start
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert "not a gRPC server" in lines[-1] and "Traceback" not in res.stderr, res.stderr
    assert took < 30.0  # not the 60 s --wait-ready-s
    assert not (tmp_path / "r").exists()


def test_report_on_a_damaged_requests_parquet_is_one_line(tmp_path: Path) -> None:
    """A requests.parquet whose second quarter is zeroed: one line naming the file and what to do."""
    run = make_run(tmp_path / "run", rate=2000.0, duration_s=30.0)
    path = run / "requests.parquet"
    table = pq.read_table(path)
    with pq.ParquetWriter(path, table.schema, compression="zstd") as w:  # row groups, as the sink writes
        for i in range(0, table.num_rows, 5000):
            w.write_table(table.slice(i, 5000))
    data = bytearray(path.read_bytes())
    q = len(data) // 4
    data[q : 2 * q] = bytes(q)
    path.write_bytes(bytes(data))
    res = netgain("report", str(run))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(path) in lines[0] and "re-run `netgain load`" in lines[0]
