"""The handler contract as a user meets it: the example in docs/server.md is examples/handler_example.py
verbatim, and that file, copied alone into an empty directory, is served, loaded and reported with
the commands its docstring gives; a handler that breaks the contract is refused in one line."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, ServerHandle, server_env
from conftest import read_rows as rows

EXAMPLE = REPO_ROOT / "examples" / "handler_example.py"


def netgain_in(cwd: Path, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``netgain ARGS`` from ``cwd`` as the console script runs it: ``-P`` keeps the current
    directory off sys.path, as the installed ``netgain`` command does."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "netgain.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=server_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_docs_show_the_example_file_verbatim() -> None:
    """The handler example a user copies from docs/server.md is the file CI serves."""
    doc = (REPO_ROOT / "docs" / "server.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert EXAMPLE.read_text() in blocks


@pytest.mark.slow
def test_example_handler_serves_loads_and_reports_from_its_own_directory(tmp_path: Path) -> None:
    """Copied into an empty directory, `netgain serve --model handler_example:ReviewScorer`
    finds it there (no PYTHONPATH), `netgain load` drives it, `netgain report` reports it."""
    shutil.copy(EXAMPLE, tmp_path / "handler_example.py")
    ports = tmp_path / "ports.json"
    with open(tmp_path / "stdout.txt", "wb") as out, open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "netgain.cli", "serve", "--model", "handler_example:ReviewScorer",
             "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--ports-file", str(ports)],
            cwd=tmp_path, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=server_env(),
        )  # fmt: skip
    server = ServerHandle(proc, tmp_path, ports, None, ())
    try:
        server.wait_serving()
        load = netgain_in(
            tmp_path, "load", "--target", server.target, "--rate", "20", "--duration", "3",
            "--warmup-s", "1", "--out", "runs/mine", "--max-send-lag-ms", "50",
        )  # fmt: skip
        assert load.returncode == 0, load.stderr + load.stdout
        r = rows(tmp_path / "runs" / "mine")
        assert len(r["status"]) > 0 and (r["status"] == "OK").all()
        report = netgain_in(tmp_path, "report", "runs/mine")
        assert report.returncode == 0, report.stderr + report.stdout
        assert "RUN: VALID" in report.stdout and "review-scorer" in report.stdout
    finally:
        assert server.terminate() == 0, server.output()


BROKEN = """
from netgain.server.handlers import Handler


class NoExample(Handler):
    def build_model(self):
        return None

    def preprocess(self, item):
        return 1

    def postprocess(self, row):
        return None


class Unfinished(NoExample):
    def example_input(self, rng, size=None):
        raise NotImplementedError


class WrongType(NoExample):
    def example_input(self, rng, size=None):
        return b"text"


class RejectsOwn(WrongType):
    def example_input(self, rng, size=None):
        from netgain.protos import inference_pb2 as pb

        return pb.Input(data=b"x")

    def preprocess(self, item):
        raise KeyError("vocab")
"""


@pytest.mark.parametrize(
    ("cls", "says"),
    [
        ("NoExample", "handler mine:NoExample does not define example_input()"),
        ("Unfinished", "mine:Unfinished.example_input is not implemented"),
        ("WrongType", "mine:WrongType.example_input returned bytes, not an Input"),
        ("RejectsOwn", "mine:RejectsOwn.preprocess(example_input()) raised KeyError: 'vocab'"),
        ("Missing", "has no class 'Missing'"),
    ],
)
def test_a_broken_handler_is_refused_at_start_up_in_one_line(tmp_path: Path, cls: str, says: str) -> None:
    """`netgain serve` checks a user's handler before serving: exit 2, one line naming the method."""
    (tmp_path / "mine.py").write_text(BROKEN)
    res = netgain_in(tmp_path, "serve", "--model", f"mine:{cls}", "--port", "0", "--metrics-port", "-1")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "Traceback" not in res.stderr
