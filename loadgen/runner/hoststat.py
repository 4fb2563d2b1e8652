"""The load generator's host, read from Linux ``/proc`` once a second: its CPU time (busy and
steal, summed over its CPUs) and the CPU time of the load generator's own processes (the master
and every process under it: Locust workers and their sender engines).

With the server on the same host, the report subtracts the server's and the load generator's CPU
from the host's busy time: what is left is what other processes took (host contention). Readings
are counters in seconds, kept as read (the report derives rates, analysis/counters.py); a host
without ``/proc`` gives none, never an error.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("netgain.loadgen")

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HOST_CPU = "netgain_host_cpu_seconds_total"  # labels mode=busy|steal
HOST_CORES = "netgain_host_cpu_cores"
LOADGEN_CPU = "netgain_loadgen_cpu_seconds_total"
# Fields after a /proc/PID/stat line's ")": state is 0, ppid 1, utime 11, stime 12, cutime 13, cstime 14.
_PPID, _UTIME, _CSTIME = 1, 11, 14


@dataclass(frozen=True)
class HostCpu:
    busy_s: float  # user + nice + system + irq + softirq (guest time is inside user)
    steal_s: float  # time the hypervisor gave this host's virtual CPUs to someone else
    cores: int


def parse_proc_stat(text: str) -> HostCpu:
    """The aggregate ``cpu`` line of ``/proc/stat`` and the count of ``cpuN`` lines. ValueError when
    the text has no aggregate line."""
    total: list[int] | None = None
    cores = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            total = [int(x) for x in line.split()[1:]]
        elif line.startswith("cpu") and line[3:4].isdigit():
            cores += 1
    if total is None:
        raise ValueError("/proc/stat has no aggregate cpu line")
    total += [0] * (8 - len(total))
    user, nice, system, _idle, _iowait, irq, softirq, steal = total[:8]
    return HostCpu((user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK, cores)


def tree_cpu_s(root: int, stats: dict[int, list[bytes]]) -> float:
    """CPU seconds of ``root`` and its descendants in ``stats`` (pid -> fields after the command
    name), children already reaped included (cutime, cstime): a sum that never falls when a
    process of the tree exits."""
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[_PPID]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        mine = stats.get(pid)
        if mine is None:
            continue
        total += sum(int(x) for x in mine[_UTIME : _CSTIME + 1])
        todo.extend(children.get(pid, ()))
    return total / CLK_TCK


def _proc_stats(proc: str) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), "rb") as fh:
                out[int(name)] = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # the process ended between listing and reading
            continue
    return out


class HostSampler:
    """Readings of the host and of the process tree under ``root`` (default: this process)."""

    def __init__(self, root: int | None = None, proc: str = "/proc") -> None:
        self.root = root if root is not None else os.getpid()
        self.proc = proc
        self._failed = False

    def read(self) -> list[tuple[str, str, float]]:
        """``(metric, labels, value)`` rows; none when /proc cannot be read (logged once)."""
        try:
            with open(os.path.join(self.proc, "stat")) as fh:
                host = parse_proc_stat(fh.read())
            mine = tree_cpu_s(self.root, _proc_stats(self.proc))
        except (OSError, ValueError) as exc:  # a sampler never fails the run
            if not self._failed:
                self._failed = True
                log.warning("cannot read host CPU from %s (%s): host contention not measured", self.proc, exc)
            return []
        return [
            (HOST_CPU, "mode=busy", host.busy_s),
            (HOST_CPU, "mode=steal", host.steal_s),
            (HOST_CORES, "", float(host.cores)),
            (LOADGEN_CPU, "", mine),
        ]
