"""The bottleneck kind from the resource summaries (``resources``), with the evidence that decided it.

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

from typing import Any

from netgain.analysis import saturation as sat
from netgain.analysis.resources import QUEUE_RISE
from netgain.analysis.saturation import (
    CORES_SATURATED,
    DEVICE_BUSY,
    INTERPRETER_SATURATED,
    NEAR_SATURATION,
    PROCESS_SATURATED,
    THREAD_SATURATED,
)

DEVICE_IDLE = 0.50
WORKER_CPU_SATURATED = 0.90
NEAR_CAPACITY = "near capacity: no backlog has built yet"

# The gpu-bound action in two parts, so the precision lever goes between them (``precision_lever``).
GPU_BOUND_BATCH = "batch more (--max-batch-size, --max-queue-delay-ms)"
GPU_BOUND_SCALE = "then a bigger device or more replicas"
ACTIONS = {
    "gpu-bound": f"{GPU_BOUND_BATCH}, {GPU_BOUND_SCALE}",
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
    "queue-bound": "or a larger --max-queue-size, which queues the requests it now sheds within the SLO",
    "unsaturated": "latency is fixed cost: nothing to scale; shorter --max-queue-delay-ms or a faster "
    "device per request lowers it, and when the tail is queue (requests waiting for the batch ahead) "
    "more model instances (--instances) or smaller batches",
    "host-contention": "give the server a host (or cores) of its own: other processes, or the "
    "hypervisor's steal time, take the CPU it needs; measure again on a quiet host",
    "unknown": "none from this run: the server's resources were not measured; read its own metrics "
    "(queue and compute time, device and CPU utilisation)",
}


# A float32 forward on a GPU: its tensor cores run bf16 several times faster (``precision_lever``).
LOWER_PRECISION = "a lower precision (--dtype bfloat16, where the model's accuracy allows)"
# The image handlers' GPU pre-processing, named where an action suggests it (``decode_lever``).
GPU_PRE = "GPU pre-processing"
GPU_PRE_IMAGE = "GPU pre-processing with --handler-option decode=gpu"


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
    precision_lever: bool = False,
    p99_held: bool | None = None,
) -> dict[str, Any]:
    """The bottleneck: ``kind`` (the first of ``kinds``), its ``evidence`` and ``action``; every kind
    that applies in ``kinds``, each with its own evidence lines and next action. ``server_known``
    False (a target without netgain telemetry): the server is not judged, its kind is ``unknown``
    unless the load generator's own kind applies. ``missed`` says how the run missed its SLO (then
    the server is never ``unsaturated``); ``shed`` counts RESOURCE_EXHAUSTED answers.
    ``decode_lever``: an image handler on a GPU that decodes on the CPU, so an action suggesting GPU
    pre-processing names its option. ``precision_lever``: a GPU forward in float32, so a gpu-bound
    action names a lower precision before a bigger device. ``p99_held``: the run's p99 met its SLO
    (None: no SLO given); requests shed while it did name the queue bound as a lever."""
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
    lever = _queue_bound_lever(queue, shed, p99_held)
    if server_saturated or not kinds:
        srv = {k: v for k, v in server.items() if k != "measured"}
        srv["evidence"] = srv_ev
        if drops == "target":
            srv["evidence"] = [*srv_ev, *gen_ev]
            srv["action"] = f"{server['action']}; {ACTIONS['target-drops']}"
        if lever:  # the server's kind only: the load generator's has nothing to do with the bound
            srv["evidence"] = [*srv["evidence"], lever]
            srv["action"] = f"{srv['action']}; {ACTIONS['queue-bound']}"
        kinds.append(srv)
    if lever:
        srv_ev = [*srv_ev, lever]
    if decode_lever:
        for k in kinds:
            k["action"] = k["action"].replace(GPU_PRE, GPU_PRE_IMAGE)
    if precision_lever:
        for k in kinds:
            if k["kind"] == "gpu-bound":
                k["action"] = k["action"].replace(
                    ACTIONS["gpu-bound"], f"{GPU_BOUND_BATCH}, {LOWER_PRECISION}, {GPU_BOUND_SCALE}"
                )
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


def _queue_bound_lever(queue: dict[str, Any], shed: int, p99_held: bool | None) -> str:
    """An evidence line when requests were shed while the run's p99 met its SLO: the queue bound,
    not latency, refused them, so a larger bound would have served them within the SLO."""
    if not shed or not p99_held:
        return ""
    cap = queue.get("max_queue_size")
    bound = f"--max-queue-size {cap}" if cap else "the server's queue bound"
    return (
        f"{shed} request(s) shed at {bound} while p99 met the SLO: the bound, not latency, refused "
        "them (a larger bound queues them instead)"
    )
