"""How near each of the server's resources is to saturation, and how much of the host other
processes took: the figures the bottleneck names when no resource crossed its line.

Each resource's **ratio** is its figure over its saturation threshold (1.0: at the threshold), so
resources of different units rank on one scale, nearest first. A run that missed its SLO, or whose
backlog grows, names the nearest: the ranking moves smoothly with the figures, where an on/off
threshold on a noisy one (the queue's rise) flips between neighbouring rates of a sweep.

**Host contention** needs the load generator's host samples (``netgain_host_cpu_ratio{mode}``,
``netgain_loadgen_cpu_ratio``, ``netgain_host_cpu_cores``) and the server on that host (meta.json's
``host.client`` equal to ``host.server``): other processes' CPU is the host's busy time less the
server's processes and the load generator's. Steal time is the hypervisor's, host-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DEVICE_BUSY = 0.85
THREAD_SATURATED = 0.90
CORES_SATURATED = 0.80
PROCESS_SATURATED = 0.90
INTERPRETER_SATURATED = 0.80
NEAR_SATURATION = 0.90  # a resource at this fraction of its threshold is near saturation
HOST_OTHER_SIGNIFICANT = 0.25  # other processes' share of the host's cores
HOST_FULL = 0.85  # the host's busy + steal share at which what others take is taken from the server
STEAL_SIGNIFICANT = 0.05  # steal time's share of the host's cores


@dataclass(frozen=True)
class Pressure:
    """One resource: its ratio to its saturation threshold, the figure it was computed from, and
    the kind and action the bottleneck names when it binds."""

    resource: str
    ratio: float
    figure: str
    kind: str
    action: str


def pressures(gpu: dict[str, Any], cpu: dict[str, Any], on_gpu: bool) -> list[Pressure]:
    """Every measured resource of the server, nearest saturation first (ties in the order below)."""
    util, busy = gpu.get("utilization_mean"), gpu.get("kernel_busy_mean")
    busiest = max([x for x in (util, busy) if x is not None], default=None)
    cores, proc = cpu.get("cores"), cpu.get("process_mean")
    by_role = cpu.get("by_role") or {}
    out: list[Pressure] = []
    dev_kind = "gpu-bound" if on_gpu else "cpu-bound"
    if busiest is not None:
        # named as the rules name it: the GPU, or on a cpu run the forward pass (model compute)
        out.append(
            Pressure(
                "gpu" if on_gpu else "model compute",
                busiest / DEVICE_BUSY,
                f"device busy {busiest:.2f} (saturated >= {DEVICE_BUSY})",
                dev_kind,
                dev_kind,
            )
        )
    parts = [by_role[r] for r in ("compute", "device") if by_role.get(r) is not None]
    if not on_gpu and parts and cores:
        compute = float(sum(parts))
        out.append(
            Pressure(
                "model compute",
                compute / (CORES_SATURATED * cores),
                f"model compute {compute:.2f} of {cores:.2f} cores (saturated >= {CORES_SATURATED})",
                "cpu-bound",
                "cpu-bound",
            )
        )
    interp = (cpu.get("interpreter") or {}).get("per_process")
    if interp is not None:
        out.append(
            Pressure(
                "interpreter",
                interp / INTERPRETER_SATURATED,
                f"interpreter {interp:.2f} core per process (saturated >= {INTERPRETER_SATURATED})",
                "upstream-bound",
                "interpreter",
            )
        )
    for role, v in (cpu.get("per_thread") or {}).items():
        out.append(
            Pressure(
                role,
                v / THREAD_SATURATED,
                f"{role} {v:.2f} core per thread (saturated >= {THREAD_SATURATED})",
                "upstream-bound",
                role,
            )
        )
    if cores and proc is not None:
        out.append(
            Pressure(
                "process",
                proc / (PROCESS_SATURATED * cores),
                f"process {proc:.2f} of {cores:.2f} cores (saturated >= {PROCESS_SATURATED})",
                "upstream-bound" if on_gpu else "cpu-bound",
                "process",
            )
        )
    return sorted(out, key=lambda p: -p.ratio)


def ranking(ps: list[Pressure]) -> str:
    """The evidence line: each resource with its figure and its ratio, nearest first."""
    if not ps:
        return "nearest saturation: no server resource measured"
    return "nearest saturation: " + "; ".join(f"{p.figure} at {p.ratio:.2f} of its threshold" for p in ps)


def _labelled_mean(ser: dict[str, Any], metric: str, label: str) -> float | None:
    vals = [float(v.mean()) for key, _t, v in ser.get(metric, []) if len(v) and label in key.split("|", 1)[1]]
    return float(np.mean(vals)) if vals else None


def _source_sum(ser: dict[str, Any], metric: str, prefix: str) -> float | None:
    vals = [float(v.mean()) for key, _t, v in ser.get(metric, []) if len(v) and key.startswith(prefix)]
    return float(np.sum(vals)) if vals else None


def host_contention(ser: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The host's CPU over the window (cores, 1.0 = one core) and other processes' share of it;
    None when the run has no host samples (``netgain load`` before they were taken, no /proc)."""
    busy = _labelled_mean(ser, "netgain_host_cpu_ratio", "mode=busy")
    if busy is None:
        return None
    steal = _labelled_mean(ser, "netgain_host_cpu_ratio", "mode=steal") or 0.0
    cores_vals = [float(v.max()) for _k, _t, v in ser.get("netgain_host_cpu_cores", []) if len(v)]
    cores = max(cores_vals) if cores_vals else None
    loadgen = _source_sum(ser, "netgain_loadgen_cpu_ratio", "host|") or 0.0
    hosts = meta.get("host") or {}
    same = bool(hosts.get("client")) and hosts.get("client") == hosts.get("server")
    server = _source_sum(ser, "netgain_process_cpu_ratio", "server:") if same else None
    other = max(0.0, busy - loadgen - server) if server is not None else None
    other_share = other / cores if other is not None and cores else None
    steal_share = steal / cores if cores else None
    full = (busy + steal) / cores >= HOST_FULL if cores else False
    others_take = other_share is not None and other_share >= HOST_OTHER_SIGNIFICANT and full
    stolen = steal_share is not None and steal_share >= STEAL_SIGNIFICANT
    server_versions = (meta.get("versions") or {}).get("server") or {}
    return {
        "cpu_model": server_versions.get("cpu") or None,
        "server_cores": server_versions.get("server_cores") or None,
        "cpu_isa": server_versions.get("cpu_isa") or None,
        "cores": cores,
        "busy": busy,
        "steal": steal,
        "server": server,
        "loadgen": loadgen,
        "other": other,
        "other_share": other_share,
        "steal_share": steal_share,
        "same_host": same,
        "full": bool(full),
        "significant": bool(others_take or stolen),
    }


# torch.backends.cpu.get_cpu_capability() on a CPU (or virtual machine) without AVX2.
NO_VECTOR_ISA = "DEFAULT"


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def host_evidence(host: dict[str, Any] | None) -> str | None:
    """The host-contention evidence line, with the server's cores and CPU model where the server
    reported them; None without host samples."""
    if host is None:
        return None
    head = (
        f"host: {_f(host['busy'])} of {_f(host['cores'], 'g')} cores busy, steal {_f(host['steal'])} "
        f"({_f(host['steal_share'], '.0%')}; significant >= {STEAL_SIGNIFICANT:.0%}); load generator "
        f"{_f(host['loadgen'])}"
    )
    isa = host.get("cpu_isa")
    parts = (host.get("server_cores"), host.get("cpu_model"), f"torch CPU kernels {isa}" if isa else None)
    hardware = ", ".join(x for x in parts if x)
    tail = f"; server cores {hardware}" if hardware else ""
    if isa == NO_VECTOR_ISA:
        tail += (
            " (no vector instructions reach torch on this host: its CPU forward runs several times "
            "slower than on a host whose CPU exposes AVX2)"
        )
    if not host["same_host"]:
        return (
            f"{head}; the server runs on another host, whose other processes are not measured "
            f"(host contention not judged for it){tail}"
        )
    return (
        f"{head}, server {_f(host['server'])}, other processes {_f(host['other'])} "
        f"({_f(host['other_share'], '.0%')} of the host; significant >= {HOST_OTHER_SIGNIFICANT:.0%} "
        f"while the host is >= {HOST_FULL:.0%} busy): host contention "
        + ("significant" if host["significant"] else "not significant")
        + tail
    )
