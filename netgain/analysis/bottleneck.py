"""Resource summaries from samples.parquet and the bottleneck kind, with the evidence that decided it.

Server rules (thresholds are module constants of ``saturation``, documented in docs/report.md),
first match wins:
1. ``gpu-bound``: GPU utilization or kernel busy >= DEVICE_BUSY, with a backlog or without one
   (then "near capacity": the device has no headroom left, though no backlog has built yet).
2. ``upstream-bound``: device mostly idle (GPU util and kernel busy < DEVICE_IDLE) while the
   interpreter (the interpreter-bound thread roles of one process summed: threads that need the
   GIL saturate together near one core), a pre/post thread, the frontend, or the whole process is
   saturated, and a backlog.
3. ``cpu-bound``: a cpu run whose model compute (device + intra-op threads) uses
   >= CORES_SATURATED of the cores, or whose kernel busy is >= DEVICE_BUSY.
4. The server's processes together use >= PROCESS_SATURATED of its cores (the backlog then
   waits in its sockets, where no queue gauge sees it): ``upstream-bound`` on a GPU (``cpu-bound``
   on the CPU), resource ``process``, with or without a backlog.
5. A run that missed its SLO, shed requests, or whose backlog grows is never ``unsaturated``: the
   resource nearest its saturation (``saturation.pressures``: each figure over its threshold) is
   named with its figure, or ``host-contention`` when none of the server's resources is near
   saturation while other processes (or steal time) take the host's CPU.
6. ``unsaturated`` otherwise.
Without the target's netgain telemetry (``--protocol oip``, ``oip-http``, ``http-json``: no
ServerInfo, no netgain /metrics) the server is not judged: its kind is ``unknown``, named only when
the load generator's is not.
Backlog: the queue-depth (or in-flight) fit rises by >= QUEUE_RISE requests over the window, or
the mean queue depth is >= half the server's max_queue_size, or the server shed requests.

The load generator (``loadgen-bound``: send-lag p99 > max_send_lag_ms or a worker's CPU >=
WORKER_CPU_SATURATED) is judged beside the server, not instead of it: when both apply both are
reported. Dropped requests (the generator's in-flight cap) are blamed on the target when the
generator kept its schedule and the server shows a backlog, else on the generator.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from netgain.analysis import saturation as sat
from netgain.analysis.sample_arrays import SampleArrays
from netgain.analysis.saturation import (
    CORES_SATURATED,
    DEVICE_BUSY,
    INTERPRETER_SATURATED,
    NEAR_SATURATION,
    PROCESS_SATURATED,
    THREAD_SATURATED,
)
from netgain.analysis.stats import slope

DEVICE_IDLE = 0.50
WORKER_CPU_SATURATED = 0.90
QUEUE_RISE = 8.0
NEAR_CAPACITY = "near capacity: no backlog has built yet"
# Thread roles whose CPU time is Python bytecode (it needs the GIL): the event loop and gRPC's
# Python handlers (frontend), pre/post-processing, the batcher, the samplers. The device thread
# and torch's intra-op workers mostly run with the GIL released, gRPC's own threads in C.
INTERPRETER_ROLES = ("frontend", "prepost", "batcher", "telemetry")

ACTIONS = {
    "gpu-bound": "batch more (--max-batch-size, --max-queue-delay-ms), then a bigger device or more replicas",
    "cpu-bound": "more cores for the model (--intra-op-threads, a bigger instance) or move the model "
    "to a GPU",
    "interpreter": "more processes (netgain serve --workers N: one interpreter each), or take the work "
    "out of Python (GPU pre-processing, a faster decoder)",
    "prepost": "more pre/post threads (--pre-threads), GPU pre-processing or a faster decoder",
    "frontend": "more frontend processes (netgain serve --workers N)",
    "process": "a bigger instance (more cores), or lighter pre-processing (GPU pre-processing, a "
    "faster decoder)",
    "queue": "find the stage the queue waits for: netgain profile (py-spy shows the busy thread)",
    "loadgen": "give the load generator more CPU (more netgain load --workers, another host than the server)",
    "target-drops": "offer no more than the capacity at the SLO (find it with a --sweep of lower rates); "
    "the server's kind says what to change",
    "cap-drops": "raise netgain load --max-in-flight (the latency times the rate exceeds it)",
    "unsaturated": "latency is fixed cost: nothing to scale; shorter --max-queue-delay-ms or a faster "
    "device per request lowers it, and when the tail is queue (requests waiting for the batch ahead) "
    "more model instances (--instances) or smaller batches",
    "host-contention": "give the server a host (or cores) of its own: other processes, or the "
    "hypervisor's steal time, take the CPU it needs; measure again on a quiet host",
    "unknown": "none from this run: the server's resources were not measured; read its own metrics "
    "(queue and compute time, device and CPU utilisation)",
}


# The image handlers' GPU pre-processing, named where an action suggests it (``decode_lever``).
GPU_PRE = "GPU pre-processing"
GPU_PRE_IMAGE = "GPU pre-processing with --handler-option decode=gpu"


def _labels(s: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv) if s else {}


def series(
    samples: SampleArrays | None, t0: float, t1: float
) -> dict[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    """metric -> [(labels, t, value)] inside [t0, t1], sources merged per label set: metrics in
    order of first appearance, each one's ``source|labels`` keys sorted, rows in file order."""
    out: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    if samples is None or samples.num_rows == 0:
        return out
    rows = np.flatnonzero((samples.t >= t0) & (samples.t <= t1))
    code = samples.code[rows]
    order = np.argsort(code, kind="stable")  # each series' rows together, in file order
    codes, starts = np.unique(code[order], return_index=True)
    ends = [*starts[1:].tolist(), len(order)]
    # metric -> its key strings -> the series (codes) under each, metrics by first appearance
    by_metric: dict[Any, dict[str, list[int]]] = {}
    first: dict[Any, int] = {}
    for j, c in enumerate(codes.tolist()):
        source, metric, labels = samples.keys[c]
        by_metric.setdefault(metric, {}).setdefault(f"{source}|{labels}", []).append(j)
        first[metric] = min(first.get(metric, len(rows)), int(order[starts[j]]))
    for metric in sorted(by_metric, key=first.__getitem__):
        if metric is None:  # a null metric name: no series of any use (none is read by name)
            continue
        out[metric] = []
        for key in sorted(by_metric[metric]):
            parts = [order[starts[j] : ends[j]] for j in by_metric[metric][key]]
            pick = rows[np.sort(np.concatenate(parts)) if len(parts) > 1 else parts[0]]
            out[metric].append((key, samples.t[pick], samples.value[pick]))
    return out


def _mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return float(np.mean(vals)) if vals else None


def _max_mean(ser: dict[str, Any], metric: str) -> float | None:
    vals = [float(v.mean()) for _, _, v in ser.get(metric, []) if len(v)]
    return max(vals) if vals else None


_PID = re.compile(rb"\"pid\":\s*(\d+)")


def requests_by_pid(span_log: str | Path | None) -> dict[str, Any] | None:
    """Requests per server process from the span log's ``pid`` field (a --workers server writes one
    line per request from the frontend that answered it); None without a span log or pids."""
    if span_log is None:
        return None
    counts: Counter[int] = Counter()
    with open(span_log, "rb") as fh:
        for line in fh:
            m = _PID.search(line)
            if m:
                counts[int(m.group(1))] += 1
    return {"requests_by_pid": dict(counts)} if counts else None


def _role_cpu(ser: dict[str, Any]) -> tuple[dict[str, float], int]:
    """CPU cores by thread role over the window (summed over the server's processes, averaged
    over targets), from the ratio gauge or, where the server exports counters of CPU seconds
    (``netgain_thread_cpu_seconds_total``), their rate."""
    roles: dict[str, list[float]] = {}
    sources: set[str] = set()
    for key, _t, v in ser.get("netgain_thread_cpu_ratio", []):
        if len(v):
            roles.setdefault(_labels(key.split("|", 1)[1]).get("role", "unknown"), []).append(float(v.mean()))
            sources.add(key.split("|", 1)[0])
    if not roles:
        for metric in ("netgain_thread_cpu_seconds_total", "netgain_thread_cpu_seconds"):
            for key, t, v in ser.get(metric, []):
                if len(v) >= 2 and t.max() > t.min():
                    rate = (float(v[np.argmax(t)]) - float(v[np.argmin(t)])) / float(t.max() - t.min())
                    roles.setdefault(_labels(key.split("|", 1)[1]).get("role", "unknown"), []).append(
                        max(0.0, rate)
                    )
                    sources.add(key.split("|", 1)[0])
            if roles:
                break
    n_src = max(1, len(sources))
    return {r: float(np.sum(v)) / n_src for r, v in sorted(roles.items())}, n_src


def _rise(series_list: list[tuple[str, np.ndarray, np.ndarray]], window_s: float) -> dict[str, Any]:
    if not series_list:
        return {"mean": None, "max": None, "slope_per_s": None, "rise": None}
    t = np.concatenate([s[1] for s in series_list])
    y = np.concatenate([s[2] for s in series_list])
    sl = slope(t, y)
    return {"mean": float(y.mean()), "max": float(y.max()), "slope_per_s": sl, "rise": sl * window_s}


def interpreter(by_role: dict[str, float], processes: dict[str, Any] | None) -> dict[str, Any]:
    """The interpreter's load: CPU of the interpreter-bound roles summed, per process.

    The metrics endpoint sums a ``--workers`` server's processes. With the span log's ``pid``
    counts, the busiest process's share is the sum times its share of the requests (the work
    follows the requests); without them the sum stands for one process and the figure is
    approximate for a server of several.
    """
    present = [r for r in INTERPRETER_ROLES if r in by_role]
    total = float(sum(by_role[r] for r in present)) if present else None
    out: dict[str, Any] = {
        "roles": present,
        "sum": total,
        "processes": None,
        "busiest_share": None,
        "per_process": total,
        "approximate": True,
        "method": "sum over the server's processes (the span log's pid was not available: "
        "a --workers server is judged approximately)",
    }
    counts = (processes or {}).get("requests_by_pid") or {}
    if counts and total is not None:
        n = sum(counts.values())
        share = max(counts.values()) / n if n else 1.0
        out.update(
            processes=len(counts),
            busiest_share=share,
            per_process=total * share,
            approximate=False,
            method=(
                "one process (span log pid)"
                if len(counts) == 1
                else f"{len(counts)} frontend processes (span log pid): the sum times the busiest "
                f"one's share of the requests ({share:.0%})"
            ),
        )
    return out


def summarize_resources(
    ser: dict[str, Any], meta: dict[str, Any], window_s: float, processes: dict[str, Any] | None = None
) -> tuple[dict, dict, dict]:
    """(gpu, cpu, queue) summaries of the measured window."""
    gpu: dict[str, Any] = {
        "present": "netgain_gpu_utilization_ratio" in ser,
        "utilization_mean": _mean(ser, "netgain_gpu_utilization_ratio"),
        "sm_active_mean": _mean(ser, "netgain_gpu_sm_active_ratio"),
        "kernel_busy_mean": _mean(ser, "netgain_kernel_busy_ratio"),
        "memory_used_max_bytes": None,
        "memory_total_bytes": None,
        "power_mean_watts": _mean(ser, "netgain_gpu_power_watts"),
        "name": (meta.get("versions", {}).get("server") or {}).get("gpu"),
    }
    mem = [float(v.max()) for _, _, v in ser.get("netgain_gpu_memory_used_bytes", []) if len(v)]
    tot = [float(v.max()) for _, _, v in ser.get("netgain_gpu_memory_total_bytes", []) if len(v)]
    gpu["memory_used_max_bytes"] = max(mem) if mem else None
    gpu["memory_total_bytes"] = max(tot) if tot else None
    by_role, _ = _role_cpu(ser)
    batching = (meta.get("server") or {}).get("batching") or {}
    instances = int(batching.get("instances") or 1)
    threads = {"prepost": max(1, int(batching.get("pre_threads") or 1)) * instances, "frontend": 1}
    cpu: dict[str, Any] = {
        "cores": _max_mean(ser, "netgain_cpu_cores"),
        "process_mean": _mean(ser, "netgain_process_cpu_ratio"),
        "by_role": by_role,
        "per_thread": {r: by_role[r] / threads[r] for r in threads if r in by_role},
        "interpreter": interpreter(by_role, processes),
        "worker_max": _max_mean(ser, "netgain_client_worker_cpu_ratio"),
        "host": sat.host_contention(ser, meta),
    }
    queue: dict[str, Any] = _rise(ser.get("netgain_queue_depth_requests", []), window_s)
    queue["in_flight"] = _rise(ser.get("netgain_in_flight_requests", []), window_s)
    cap = batching.get("max_queue_size")
    queue["max_queue_size"] = cap
    in_flight_rise = queue["in_flight"]["rise"]
    queue["pressure"] = bool(
        (queue["rise"] is not None and queue["rise"] >= QUEUE_RISE)
        or (cap and queue["mean"] is not None and queue["mean"] >= cap / 2)
        or (in_flight_rise is not None and in_flight_rise >= QUEUE_RISE)
    )
    return gpu, cpu, queue


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _server(
    gpu: dict, cpu: dict, queue: dict, device: str, missed: str | None = None, shed: int = 0
) -> tuple[dict[str, Any], list[str]]:
    """The server's kind (``{kind, resource, action}``) and the evidence lines it was decided on.
    ``missed``: how the run missed its SLO (None: it held, or none was given); ``shed``: requests the
    server refused with RESOURCE_EXHAUSTED (its queue was full: a backlog)."""
    ev: list[str] = []
    util, busy = gpu.get("utilization_mean"), gpu.get("kernel_busy_mean")
    busiest = max([x for x in (util, busy) if x is not None], default=None)
    on_gpu = device.startswith("cuda") or bool(gpu.get("present"))
    fl = queue.get("in_flight") or {}
    pressure = bool(queue.get("pressure")) or shed > 0
    ev.append(
        f"queue depth mean {_fmt(queue.get('mean'))}, rise over window {_fmt(queue.get('rise'))}; "
        f"in flight mean {_fmt(fl.get('mean'))}, rise {_fmt(fl.get('rise'))} "
        f"(backlog: {'yes' if queue.get('pressure') else 'no'}, rise >= {QUEUE_RISE:g})"
    )
    if shed:
        ev.append(f"{shed} request(s) shed (RESOURCE_EXHAUSTED: the server's queue was full): a backlog")
    ev.append(
        f"device {device}: GPU utilization mean {_fmt(util)}, SM active {_fmt(gpu.get('sm_active_mean'))}, "
        f"kernel busy {_fmt(busy)} (busy >= {DEVICE_BUSY}, idle < {DEVICE_IDLE})"
    )
    near = NEAR_CAPACITY

    def kind(k: str, resource: str, action: str, measured: bool = True) -> tuple[dict[str, Any], list[str]]:
        host_line = sat.host_evidence(cpu.get("host"))
        return {"kind": k, "resource": resource, "action": ACTIONS[action], "measured": measured}, (
            [*ev, host_line] if host_line else ev
        )

    if on_gpu and busiest is not None and busiest >= DEVICE_BUSY:
        if not pressure:
            ev.append(f"{near} (device busy {busiest:.2f} >= {DEVICE_BUSY})")
        return kind("gpu-bound", "gpu", "gpu-bound")
    per_thread = cpu.get("per_thread", {})
    cores, proc = cpu.get("cores"), cpu.get("process_mean")
    interp = cpu.get("interpreter") or {}
    ev.append(
        f"CPU per thread: prepost {_fmt(per_thread.get('prepost'))}, frontend "
        f"{_fmt(per_thread.get('frontend'))} core (saturated >= {THREAD_SATURATED}); process "
        f"{_fmt(proc)} of {_fmt(cores)} cores"
    )
    ev.append(
        f"interpreter: {'+'.join(interp.get('roles') or []) or 'no interpreter-bound roles'} "
        f"{_fmt(interp.get('per_process'))} core per process (saturated >= {INTERPRETER_SATURATED}: threads "
        f"that need the GIL saturate together near one core); {interp.get('method', 'n/a')}"
    )
    saturated = []
    if interp.get("per_process") is not None and interp["per_process"] >= INTERPRETER_SATURATED:
        saturated.append("interpreter")
    saturated += [r for r, v in per_thread.items() if v >= THREAD_SATURATED]
    if cores and proc is not None and proc >= PROCESS_SATURATED * cores:
        saturated.append("process")
    idle = busiest is not None and busiest < DEVICE_IDLE
    if idle and saturated and pressure:
        ev.append(f"saturated while the device idles: {', '.join(saturated)}")
        return kind("upstream-bound", saturated[0], saturated[0])
    # Model compute on a CPU run: the device worker thread calling forward plus torch's intra-op
    # (OpenMP) workers, which the server labels "device" and "compute".
    by_role = cpu.get("by_role", {})
    parts = [by_role[r] for r in ("compute", "device") if by_role.get(r) is not None]
    compute = sum(parts) if parts else None
    ev.append(
        f"model compute (device + intra-op threads) {_fmt(compute)} of {_fmt(cores)} cores "
        f"(saturated >= {CORES_SATURATED})"
    )
    if not on_gpu and (
        (compute is not None and cores and compute >= CORES_SATURATED * cores)
        or (busy is not None and busy >= DEVICE_BUSY)
    ):
        if not pressure:
            ev.append(near)
        return kind("cpu-bound", "model compute", "cpu-bound")
    if "process" in saturated:
        # Every core the server was given is busy: the backlog builds before the server counts it
        # (in its sockets, unread), so no queue gauge need rise.
        ev.append(f"the server's processes use {_fmt(proc)} of its {_fmt(cores)} cores: no headroom left")
        return kind("upstream-bound" if on_gpu else "cpu-bound", "process", "process")
    if not (pressure or missed):
        return kind("unsaturated", "none", "unsaturated")
    return _nearest(gpu, cpu, on_gpu, pressure, missed, ev, kind)


def _nearest(
    gpu: dict, cpu: dict, on_gpu: bool, pressure: bool, missed: str | None, ev: list[str], kind: Any
) -> tuple[dict[str, Any], list[str]]:
    """A run that missed its SLO, or whose backlog grows, is never ``unsaturated``: the resource
    nearest its saturation binds, unless other processes on the host (or steal) took the CPU while
    none of the server's own resources was near saturation."""
    ranked = sat.pressures(gpu, cpu, on_gpu)
    top = ranked[0] if ranked else None
    ev.append(
        (f"SLO missed ({missed}): never unsaturated" if missed else "the backlog grows: never unsaturated")
        + "; "
        + sat.ranking(ranked)
    )
    host = cpu.get("host") or {}
    if host.get("significant") and (top is None or top.ratio < NEAR_SATURATION):
        ev.append(
            "host contention, not the server, is the likely cause: no resource of the server is near "
            f"saturation (>= {NEAR_SATURATION:.2f} of its threshold) while other processes or steal time "
            "take the host's CPU"
        )
        return kind("host-contention", "host", "host-contention", measured=False)
    if top is None:
        if pressure:  # the queue's rise alone: it waits upstream of a device that is not measured
            ev.append("the backlog grows while no server resource is measured: the queue waits upstream")
            return kind("upstream-bound", "queue", "queue", measured=False)
        return kind("unknown", "server", "unknown", measured=False)
    if not pressure:
        ev.append(f"{top.resource}: {NEAR_CAPACITY}")
    if top.ratio < NEAR_SATURATION:
        ev.append(
            f"no resource is near saturation (the nearest, {top.resource}, is at {top.ratio:.2f} of its "
            "threshold): the latency a request costs at this load is above the SLO, or a resource not "
            "measured here binds"
        )
    return kind(top.kind, top.resource, top.action, measured=False)


def classify(
    gpu: dict,
    cpu: dict,
    queue: dict,
    *,
    device: str,
    send_lag_p99_ms: float | None,
    max_send_lag_ms: float,
    dropped: int,
    server_known: bool = True,
    missed: str | None = None,
    shed: int = 0,
    decode_lever: bool = False,
) -> dict[str, Any]:
    """The bottleneck: ``kind`` (the first of ``kinds``), its ``evidence`` and ``action``; every kind
    that applies in ``kinds``, each with its own evidence lines and next action. ``server_known``
    False (a target without netgain telemetry): the server is not judged, its kind is ``unknown``
    unless the load generator's own kind applies. ``missed`` says how the run missed its SLO (then
    the server is never ``unsaturated``); ``shed`` counts RESOURCE_EXHAUSTED answers.
    ``decode_lever``: an image handler on a GPU that decodes on the CPU, so an action suggesting GPU
    pre-processing names its option."""
    gen_ev: list[str] = []
    worker = cpu.get("worker_max")
    lag_bad = send_lag_p99_ms is not None and send_lag_p99_ms > max_send_lag_ms
    worker_bad = worker is not None and worker >= WORKER_CPU_SATURATED
    gen_ev.append(f"send lag p99 {_fmt(send_lag_p99_ms)} ms vs limit {max_send_lag_ms:g} ms")
    gen_ev.append(f"load worker CPU max {_fmt(worker)} core (saturated at {WORKER_CPU_SATURATED})")
    if server_known:
        server, srv_ev = _server(gpu, cpu, queue, device, missed, shed)
    else:
        server = {"kind": "unknown", "resource": "server", "action": ACTIONS["unknown"], "measured": False}
        srv_ev = [
            "server: no netgain ServerInfo or /metrics from this target (an Open Inference Protocol or "
            "HTTP run), "
            "so its queue, device and CPU are not measured and its kind is not judged"
        ]
    behind = lag_bad or worker_bad
    drops = None
    if dropped > 0:
        # Drops at the in-flight cap bound the backlog, so it stops growing: judge the server as if
        # its backlog had kept growing; a saturated resource then says the target caused them.
        held = server
        if not behind and (server["kind"] == "unsaturated" or not server["measured"]):
            held, held_ev = _server(gpu, cpu, {**queue, "pressure": True}, device, missed, shed)
            if held["measured"]:
                server = held
                srv_ev = [
                    *held_ev,
                    f"{dropped} request(s) dropped at the in-flight cap: the cap held the backlog, so it "
                    "could not grow over the window",
                ]
        drops = (
            "target" if server["kind"] != "unsaturated" and server["measured"] and not behind else "generator"
        )
        gen_ev.insert(
            1,
            f"dropped requests {dropped}: "
            + (
                "caused by the saturated target (the generator kept its schedule while the server's "
                "backlog filled the in-flight cap)"
                if drops == "target"
                else "the generator could not keep up"
                if behind
                else "the in-flight cap was too low for this latency (no server resource is saturated)"
                if server_known
                else "the in-flight cap was reached (whether the target was saturated is unknown)"
            ),
        )
    else:
        gen_ev.insert(1, "dropped requests 0")
    # An unknown server is named only when nothing else is: it is no kind that applies.
    server_saturated = server["kind"] not in ("unsaturated", "unknown")
    kinds: list[dict[str, Any]] = []
    if behind or drops == "generator":
        action = ACTIONS["loadgen"] if behind else ACTIONS["cap-drops"]
        kinds.append(
            {"kind": "loadgen-bound", "resource": "load generator", "action": action, "evidence": gen_ev}
        )
    if server_saturated or not kinds:
        srv = {k: v for k, v in server.items() if k != "measured"}
        srv["evidence"] = srv_ev
        if drops == "target":
            srv["evidence"] = [*srv_ev, *gen_ev]
            srv["action"] = f"{server['action']}; {ACTIONS['target-drops']}"
        kinds.append(srv)
    if decode_lever:
        for k in kinds:
            k["action"] = k["action"].replace(GPU_PRE, GPU_PRE_IMAGE)
    first = kinds[0]
    interp = cpu.get("interpreter") or {}
    return {
        "kind": first["kind"],
        "resource": first["resource"],
        "action": first["action"],
        "evidence": [*gen_ev, *srv_ev],
        "kinds": kinds,
        "drops_caused_by": drops,
        "approximate": bool(interp.get("approximate") and interp.get("sum") is not None),
    }


def timeseries(ser: dict[str, Any], metrics: tuple[str, ...], max_points: int = 400) -> dict[str, list]:
    """Downsampled ``label -> [[t, v], ...]`` for the HTML plots."""
    out: dict[str, list] = {}
    for metric in metrics:
        for key, t, v in ser.get(metric, []):
            lab = _labels(key.split("|", 1)[1])
            name = metric.removeprefix("netgain_") + (f"[{lab['role']}]" if "role" in lab else "")
            step = max(1, len(t) // max_points)
            order = np.argsort(t)[::step]
            out.setdefault(name, []).extend([[float(t[i]), float(v[i])] for i in order])
    return out
