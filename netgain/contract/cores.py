"""Core lists as the server and the load generator print them (taskset's notation)."""

from __future__ import annotations

from collections.abc import Sequence


def cpu_list(cpus: Sequence[int]) -> str:
    """Core numbers as taskset writes them: 0-3,8."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _sysfs(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def siblings(cpu: int, root: str = "/sys/devices/system/cpu") -> frozenset[int] | None:
    """The logical CPUs on ``cpu``'s physical core (itself included, SMT siblings beside it), from
    sysfs; None without it."""
    text = _sysfs(f"{root}/cpu{cpu}/topology/thread_siblings_list")
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def physical_cores(cpus: Sequence[int], root: str = "/sys/devices/system/cpu") -> int | None:
    """Physical cores the logical ``cpus`` sit on (SMT siblings count once); None without sysfs."""
    cores: set[frozenset[int]] = set()
    for c in cpus:
        core = siblings(c, root)
        if core is None:
            return None
        cores.add(core)
    return len(cores) or None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as the kernel reports it ("" when unknown)."""
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return " ".join(value.split())
    except OSError:
        pass
    return ""


def describe_cores(cpus: Sequence[int], root: str = "/sys/devices/system/cpu") -> str:
    """``0-11 (12 logical on 6 physical cores)``: a process's cores and how many physical cores hold them."""
    physical = physical_cores(cpus, root)
    where = f" on {physical} physical cores" if physical else ""
    return f"{cpu_list(cpus)} ({len(cpus)} logical{where})"
