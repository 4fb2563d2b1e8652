"""The load generator's, report's and CLI's failures say what happened, in one line.

Fast checks call the library or ``netgain.cli.main`` in-process; the slow ones start real
``netgain serve`` / ``netgain load`` processes on 127.0.0.1, every wait bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_fixtures import make_run
from conftest import netgain_cmd, read_meta, run_netgain, server_env

from netgain.cli import build_parser, main
from netgain.cli.args import PER_COMMAND, env_name
from netgain.cli.load import _check_out, _fit_trace
from netgain.errors import NetgainError
from netgain.loadgen.payloads import PayloadFactory
from netgain.loadgen.runner.probe import probe_target
from netgain.loadgen.traces import Trace, TraceError, read_trace, rescale


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "[Errno" not in err and "usage:" not in err, err
    return lines[0]


# -- one-line argument errors ---------------------------------------------------------
@pytest.mark.parametrize(
    "argv, words",
    [
        (["load", "--target", "127.0.0.1:1", "--rate", "abc", "--out", "x"], "--rate"),
        (["serve", "--port", "p"], "--port"),
        (["report"], "RUN_DIR"),
        (["load", "--target", "localhost:notaport", "--out", "x"], "notaport"),
    ],
)
def test_argument_errors_are_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc == 2
    assert words in one_line_error(err)


def test_out_that_is_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    rc = main(["load", "--target", "127.0.0.1:1", "--out", str(f)])
    assert rc == 2 and "is a file" in one_line_error(capsys.readouterr().err)


# -- an existing run is not overwritten without --force ---------------------------------
def test_out_with_a_run_is_refused_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", duration_s=2.0, warmup_s=0.5)
    (run / "report.json").write_text("{}")
    rc = main(["load", "--target", "127.0.0.1:1", "--out", str(run)])
    assert rc == 2 and "--force" in one_line_error(capsys.readouterr().err)
    assert (run / "meta.json").exists()
    _check_out(str(run), force=True)  # replaced: nothing of the old run, no old report, is left
    assert not any((run / n).exists() for n in ("meta.json", "requests.parquet", "report.json"))
    _check_out(str(tmp_path / "new"), force=False)  # a new directory is fine


# -- one meaning per environment variable ----------------------------------------------
def _flag_users() -> dict[str, set[str]]:
    users: dict[str, set[str]] = {}

    def walk(p: argparse.ArgumentParser) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in {id(v): v for v in a.choices.values()}.values():
                    walk(sp)
            elif a.option_strings and a.option_strings[-1] not in ("--help", "--debug"):
                users.setdefault(a.option_strings[-1], set()).add(p.prog)

    walk(build_parser())
    return users


def test_flags_whose_meaning_differs_read_a_per_command_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    users = _flag_users()
    assert {f for f, progs in users.items() if len(progs) > 1} >= PER_COMMAND
    for name in ("--model", "--metrics-port", "--out", "--seed", "--workers"):
        assert name in PER_COMMAND
    monkeypatch.setenv("NETGAIN_METRICS_PORT", "9464")  # meant for serve: load ignores it
    monkeypatch.setenv("NETGAIN_SERVE_MODEL", "null")
    monkeypatch.setenv("NETGAIN_TRACE_SYNTH_MODEL", "gamma")
    monkeypatch.setenv("NETGAIN_LOAD_OUT", "runs/x")
    p = build_parser()
    load = p.parse_args(["load"])
    assert load.metrics_port == -1 and load.out == "runs/x"
    assert load._env_warnings == [
        "NETGAIN_METRICS_PORT is not read: --metrics-port's meaning differs between subcommands; "
        "set NETGAIN_LOAD_METRICS_PORT"
    ]
    assert p.parse_args(["serve"]).model == "null"
    with pytest.raises(SystemExit):  # NETGAIN_LOAD_OUT is load's: synth still needs its --out
        p.parse_args(["trace", "synth", "--duration", "1"])
    synth = p.parse_args(["trace", "synth", "--duration", "1", "--out", "t.csv"])
    assert synth.model == "gamma" and synth.out == "t.csv"
    assert env_name("--metrics-port", "LOAD") == "NETGAIN_LOAD_METRICS_PORT"
    assert env_name("--max-batch-size", "SERVE") == "NETGAIN_MAX_BATCH_SIZE"


# -- a recorded trace replays whole unless asked -----------------------------------------
def _args(**kw: Any) -> argparse.Namespace:
    base = {"trace": "rec.csv", "rate": None, "duration": None, "warmup_s": 0.0}
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_recorded_trace_replays_whole_and_exactly_by_default() -> None:
    t = np.arange(6000) * 0.01  # a 60 s recording: last request at 59.99 s
    trace = Trace(t, np.zeros(6000), np.ones(6000))
    same, measured, note = _fit_trace(trace, _args(warmup_s=5.0), rescale)
    assert same is trace and measured == pytest.approx(59.99 - 5.0) and note == ""
    for duration in (60.0, 59.99):  # --duration equal to the trace's length: nothing appended
        same, measured, note = _fit_trace(trace, _args(duration=duration), rescale)
        assert same is trace and len(same) == 6000 and note == ""
    cut, _, note = _fit_trace(trace, _args(duration=30.0), rescale)
    assert len(cut) == 3001 and "cut to its first 30 s" in note
    looped, _, note = _fit_trace(trace, _args(duration=90.0), rescale)
    assert len(looped) > 6000 and "looped" in note
    scaled, measured, note = _fit_trace(trace, _args(rate=200.0), rescale)
    assert len(scaled) == 6000 and "time scaled" in note and measured == pytest.approx(scaled.duration_s)


# -- a size column under another name is not silently ignored ---------------------------
def test_a_size_like_column_is_an_error_naming_size_column(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("t,size_bytes\n0.0,5000\n0.1,6000\n")
    with pytest.raises(TraceError, match=r"size_bytes.*--size-column size_bytes"):
        read_trace(p)
    p.write_text("timestamp,size\n0.0,5000\n")
    with pytest.raises(TraceError, match=r"--time-column timestamp"):
        read_trace(p)
    p.write_text("t,size,request_bytes,comment\n0.0,5000,1,x\n")  # with 'size' present: fine
    assert list(read_trace(p).size) == [5000]


# -- more distinct payloads per size bucket -----------------------------------------------
def test_payload_variants_give_distinct_payloads() -> None:
    few = {PayloadFactory("null", variants=8).request_bytes(i, 1000, 1) for i in range(64)}
    many = {PayloadFactory("null", variants=64).request_bytes(i, 1000, 1) for i in range(64)}
    assert len(few) == 8 and len(many) == 64


# -- report's one-line errors and a closed pipe -------------------------------------------
def test_report_on_a_wrong_typed_meta_field_is_one_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", duration_s=2.0, warmup_s=0.5)
    meta = json.loads((run / "meta.json").read_text())
    meta["config"] = "not an object"
    (run / "meta.json").write_text(json.dumps(meta))
    r = run_netgain("report", str(run), timeout=120)
    assert r.returncode == 2 and "meta.json" in one_line_error(r.stderr)


def test_report_into_a_closed_pipe_is_silent(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", duration_s=2.0, warmup_s=0.5)
    proc = subprocess.Popen(
        netgain_cmd("report", str(run)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(),
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err.decode() == ""


def test_report_headline_says_the_target_went_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statuses = {i: "UNAVAILABLE" for i in range(800, 2000)}  # most measured requests
    run = make_run(tmp_path / "run", statuses=statuses)
    assert main(["report", str(run), "--bootstrap", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("RUN: VALID - TARGET WENT AWAY:") and "UNAVAILABLE" in first


# -- a refused connection fails fast -------------------------------------------------------
def test_a_refused_connection_fails_in_seconds_not_the_whole_wait() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(NetgainError, match="refused the connection"):
        probe_target(f"127.0.0.1:{port}", wait_ready_s=30.0, refused_grace_s=0.5)
    assert time.monotonic() - t0 < 10.0


# -- a taken metrics port, and the server's reason through demo/drill/profile -------------
@pytest.mark.slow
def test_a_taken_metrics_port_names_the_flag_and_orchestration_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from netgain.experiments.orchestrate import ServerProcess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "server.log"
        sp = ServerProcess(
            ["--model", "null", "--workers", "0", "--metrics-port", str(port)], log_path=str(log)
        )
        monkeypatch.setenv("PYTHONPATH", server_env()["PYTHONPATH"])  # this tree's netgain
        try:
            with pytest.raises(NetgainError) as info:
                sp.start()
                sp.wait_ready()
        finally:
            sp.stop()
    msg = str(info.value)
    assert "status 2" in msg and f"--metrics-port {port}" in msg and "[Errno" not in msg, msg


# -- the server killed mid-run -------------------------------------------------------------
@pytest.mark.slow
def test_server_killed_mid_run_exits_5_and_says_the_target_went_away(
    start_server: Any, tmp_path: Path
) -> None:
    server = start_server("--model", "null", "--workers", "0")
    out = tmp_path / "run"
    load = subprocess.Popen(
        netgain_cmd(
            "load",
            "--target",
            server.target,
            "--rate",
            "40",
            "--duration",
            "6",
            "--warmup-s",
            "1",
            "--out",
            str(out),
            "--quiet",
            "--timeout-s",
            "2",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=server_env(),
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (out / "requests.parquet").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.5)  # into the measured window
    os.kill(server.pid, signal.SIGKILL)
    stdout, stderr = load.communicate(timeout=120)
    assert load.returncode == 5, stdout + stderr
    last = stdout.strip().splitlines()[-1]
    assert "TARGET WENT AWAY" in last and "UNAVAILABLE" in last, stdout
    assert read_meta(out)["validity"]["valid"] is True
    rep = run_netgain("report", str(out), "--bootstrap", "0")
    assert rep.stdout.splitlines()[0].startswith("RUN: VALID - TARGET WENT AWAY"), rep.stdout
    # --max-error-rate allows failures: then only its own limit decides (exit 4 when above)
    again = run_netgain(
        "load",
        "--target",
        server.target,
        "--duration",
        "1",
        "--out",
        str(tmp_path / "r2"),
        "--wait-ready-s",
        "0",
    )
    assert again.returncode == 2 and "not ready" in one_line_error(again.stderr)
