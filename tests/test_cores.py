"""Core lists and the CPU topology the server reports beside its versions."""

from __future__ import annotations

from pathlib import Path

from netgain.contract.cores import cpu_list, cpu_model, describe_cores, physical_cores, siblings


def _sysfs(root: Path, cpu: int, siblings: str) -> None:
    d = root / f"cpu{cpu}" / "topology"
    d.mkdir(parents=True)
    (d / "thread_siblings_list").write_text(f"{siblings}\n")


def test_smt_siblings_count_as_one_physical_core(tmp_path: Path) -> None:
    for cpu in range(4):  # cpu0/cpu2 and cpu1/cpu3 are siblings, as Linux numbers them
        _sysfs(tmp_path, cpu, f"{cpu % 2},{cpu % 2 + 2}")
    _sysfs(tmp_path, 4, "4")  # a core without a sibling
    assert siblings(0, str(tmp_path)) == {0, 2}
    assert physical_cores([0, 1, 2, 3], str(tmp_path)) == 2
    assert physical_cores([0, 1, 2, 3, 4], str(tmp_path)) == 3
    assert describe_cores([0, 1, 2, 3], str(tmp_path)) == "0-3 (4 logical on 2 physical cores)"


def test_without_sysfs_only_the_logical_cores_are_said(tmp_path: Path) -> None:
    assert physical_cores([0, 1], str(tmp_path)) is None
    assert describe_cores([0, 1, 5], str(tmp_path)) == "0-1,5 (3 logical)"
    assert cpu_list([3, 0, 1, 2, 8]) == "0-3,8"


def test_the_cpu_model_comes_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: Example\nmodel name\t: Example  CPU @ 3.0GHz\n\n")
    assert cpu_model(str(info)) == "Example CPU @ 3.0GHz"
    assert cpu_model(str(tmp_path / "missing")) == ""
