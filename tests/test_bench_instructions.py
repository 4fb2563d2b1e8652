"""benchmarks/bench_instructions.py's --workers bookkeeping: which process is which role, and the
per-role sums of cachegrind's files (the valgrind runs themselves are a benchmark, not a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_instructions as bi  # noqa: E402


def _cg_file(path: Path, instructions: int) -> None:
    body = f"fl=a.c\nfn=f\n1 {instructions}\nsummary: {instructions}\n"
    path.write_text(f"desc: I1 cache: x\ncmd: python\nevents: Ir\n{body}")


def test_by_role_sums_each_role_and_counts_unknown_processes_as_other(tmp_path: Path) -> None:
    for pid, n in ((10, 1_000), (11, 200), (12, 300), (13, 40), (14, 5)):
        _cg_file(tmp_path / f"cg.{pid}", n)
    roles = {11: "frontend", 12: "frontend", 13: "device"}
    assert bi.by_role(str(tmp_path), roles, supervisor=10) == {
        "supervisor": 1_000,
        "frontend": 500,
        "device": 40,
        "other": 5,
    }


def test_by_role_refuses_a_run_where_a_process_left_no_file(tmp_path: Path) -> None:
    _cg_file(tmp_path / "cg.10", 1_000)
    with pytest.raises(SystemExit, match="process 11 \\(device\\)"):
        bi.by_role(str(tmp_path), {11: "device"}, supervisor=10)


def test_server_cmd_traces_children_only_with_workers() -> None:
    one = bi.server_cmd(True, "cg", "ports.json", 0, 0)
    assert "--trace-children=yes" not in one and "--workers" not in one
    multi = bi.server_cmd(False, "cg.%p", "ports.json", 2, 1)
    assert "--trace-children=yes" in multi and "--cachegrind-out-file=cg.%p" in multi
    assert multi[multi.index("--workers") + 1] == "2" and multi[multi.index("--pre-processes") + 1] == "1"
    assert multi[-1] == "--no-instrumentation"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_child_roles_reads_the_name_a_child_gives_its_main_thread() -> None:
    code = (
        "import sys, time\n"
        "from netgain.server.threadnames import name_os_thread\n"
        "name_os_thread(sys.argv[1])\n"
        "print('named', flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kids = [
        subprocess.Popen(
            [sys.executable, "-c", code, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("netgain-front-3", "netgain-pre-4", "netgain-device", "netgain-other")
    ]
    try:
        for kid in kids:
            assert kid.stdout is not None and kid.stdout.readline() == "named\n"
        roles = bi.child_roles(os.getpid())
        assert [roles.get(k.pid) for k in kids] == ["frontend", "pre-processing", "device", "other"]
    finally:
        for kid in kids:
            kid.communicate("", timeout=30)


def test_cpu_seconds_counts_this_process_and_grows_with_work() -> None:
    before = bi.cpu_seconds([os.getpid()])
    deadline = bi.time.process_time() + 0.2
    while bi.time.process_time() < deadline:  # 20 clock ticks of CPU, not of wall clock: /proc counts ticks
        pass
    after = bi.cpu_seconds([os.getpid()])
    assert 0 < before[0] <= before[1] and after[0] >= before[0] and after[1] >= after[0]
    assert after[1] - before[1] >= 0.1  # the loop's CPU, however the kernel split it into user and system


def test_report_rate_converts_at_the_median_trials_rates() -> None:
    line = bi.report_rate(900_000, 30_000, [(300.0, 400.0), (280.0, 350.0), (320.0, 450.0)])
    assert "3,000 instructions per µs of user time, 2,250 per µs of CPU" in line
    assert "+30,000 instructions ≈ +10.0 µs of user time, +13.3 µs at the all-CPU rate" in line


def test_run_repeat_interleaves_on_and_off_and_takes_each_sides_slope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fake(instrumented: bool, k: int, *_: object) -> dict[str, int]:
        calls.append((instrumented, k))
        per = 110 if instrumented else 100  # instructions per request of the frontend
        return {"frontend": 5_000 + per * k, "device": 7_000 + 20 * k}

    monkeypatch.setattr(bi, "count_instructions", fake)
    a = bi.argparse.Namespace(concurrency=64, workers=1, pre_processes=1)
    out = bi.run_repeat(a, 1_000, 3_000, str(tmp_path), 1)
    assert calls == [(True, 1_000), (False, 1_000), (True, 3_000), (False, 3_000)]  # odd repeat: on first
    assert out[False] == {"frontend": 100, "device": 20, "all": 120}
    assert out[True] == {"frontend": 110, "device": 20, "all": 130}
