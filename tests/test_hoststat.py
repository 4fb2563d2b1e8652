"""The load generator's host readings: /proc/stat's busy and steal time, the CPU of the load
generator's own process tree, and the ratios the report derives from them."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from netgain.analysis.counters import with_ratios
from netgain.contract.records import sample_schema
from netgain.loadgen.runner.hoststat import CLK_TCK, HostSampler, parse_proc_stat, tree_cpu_s

STAT = (
    "cpu  1000 100 400 9000 50 20 30 200 0 0\n"
    "cpu0 500 50 200 4500 25 10 15 100 0 0\n"
    "cpu1 500 50 200 4500 25 10 15 100 0 0\n"
    "intr 12345\nctxt 999\n"
)


def _pid_stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    # a command name with a space and a ")" in it, as /proc allows
    fields = ["S", ppid, 0, 0, 0, 0, 0, 0, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1, 0, 100]
    return f"{pid} (odd) name) " + " ".join(str(f) for f in fields) + "\n"


def _fake_proc(root: Path, procs: dict[int, tuple[int, int, int]], stat: str = STAT) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(stat)
    for pid, (ppid, utime, stime) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(_pid_stat(pid, ppid, utime, stime))
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return root


def test_parse_proc_stat_counts_busy_steal_and_cpus() -> None:
    host = parse_proc_stat(STAT)
    assert host.cores == 2
    assert host.busy_s == pytest.approx((1000 + 100 + 400 + 20 + 30) / CLK_TCK)
    assert host.steal_s == pytest.approx(200 / CLK_TCK)
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        parse_proc_stat("intr 1\n")


def test_tree_cpu_sums_the_root_and_its_descendants_only(tmp_path: Path) -> None:
    """Master 10 -> worker 11 -> engine 12 are summed; 13 (another parent) and 1 are not."""
    proc = _fake_proc(
        tmp_path / "proc",
        {1: (0, 999, 999), 10: (1, 100, 50), 11: (10, 30, 20), 12: (11, 300, 100), 13: (1, 700, 700)},
    )
    sampler = HostSampler(root=10, proc=str(proc))
    rows = {(m, lab): v for m, lab, v in sampler.read()}
    assert rows[("netgain_loadgen_cpu_seconds_total", "")] == pytest.approx(600 / CLK_TCK)
    assert rows[("netgain_host_cpu_cores", "")] == 2.0
    assert rows[("netgain_host_cpu_seconds_total", "mode=steal")] == pytest.approx(200 / CLK_TCK)
    stats = {10: b"S 1 0 0 0 0 0 0 0 0 0 5 5 40 10".split()}
    assert tree_cpu_s(10, stats) == pytest.approx(60 / CLK_TCK)  # reaped children's time counts


def test_no_proc_gives_no_rows_and_no_error(tmp_path: Path) -> None:
    assert HostSampler(proc=str(tmp_path / "missing")).read() == []


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc")
def test_this_host_reads() -> None:
    rows = {(m, lab): v for m, lab, v in HostSampler().read()}
    assert rows[("netgain_host_cpu_cores", "")] >= 1
    assert rows[("netgain_host_cpu_seconds_total", "mode=busy")] > 0
    assert rows[("netgain_loadgen_cpu_seconds_total", "")] > 0  # this test process has used CPU


def test_the_report_derives_cores_in_use_from_the_counters() -> None:
    """Busy seconds 10 -> 13 over 1 s is 3 cores; steal 1 -> 1.5, 0.5 core; the load generator 0.25."""
    rows = [
        (1.0, "host", "netgain_host_cpu_seconds_total", "mode=busy", 10.0),
        (2.0, "host", "netgain_host_cpu_seconds_total", "mode=busy", 13.0),
        (1.0, "host", "netgain_host_cpu_seconds_total", "mode=steal", 1.0),
        (2.0, "host", "netgain_host_cpu_seconds_total", "mode=steal", 1.5),
        (1.0, "host", "netgain_loadgen_cpu_seconds_total", "", 4.0),
        (2.0, "host", "netgain_loadgen_cpu_seconds_total", "", 4.25),
    ]
    cols = list(zip(*rows, strict=True))
    schema = sample_schema()
    table = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schema, cols, strict=True)}, schema=schema)
    out = with_ratios(table).to_pylist()
    derived = {(r["metric"], r["labels"]): r["value"] for r in out if r["metric"].endswith("_ratio")}
    assert derived == {
        ("netgain_host_cpu_ratio", "mode=busy"): 3.0,
        ("netgain_host_cpu_ratio", "mode=steal"): 0.5,
        ("netgain_loadgen_cpu_ratio", ""): 0.25,
    }
