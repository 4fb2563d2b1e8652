"""``netgain serve --workers N``: a supervisor, N frontend processes and one device process.

The supervisor claims the port, sizes and maps the hand-off slots, and forks the device
process and the frontends before it starts any thread (so the forks are safe, and it never
touches CUDA itself). It serves the one /metrics endpoint, turns health SERVING in every
frontend once all are warm, reports a frontend that exits, and on SIGTERM drains the
frontends before it stops the device process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import pickle
import random
import signal
import statistics
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from netgain.contract.cores import cpu_list
from netgain.server import eventloop
from netgain.server.coldstart import ColdStart
from netgain.server.config import ServeConfig, core_sets
from netgain.server.multiproc.slots import ITEM_HEADER, Ring
from netgain.server.ports import release_claims

MIN_SLOT_BYTES = 64 * 1024


def say(line: str, err: bool = False) -> None:
    print(f"netgain serve: {line}", file=sys.stderr if err else sys.stdout, flush=True)


def item_bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def measure_items(handler: Any, seed: int, budget_s: float = 0.5) -> tuple[int, float, int]:
    """Slot bytes (room for the largest of a few pre-processed example items, a quarter to spare,
    and for the handler's ``max_item_bytes``), the median of their pre-processing CPU times in ms
    (one thread, the first call excluded; the items twice more while within ``budget_s``: one
    fastest call swung the --pre-processes auto split between runs) and the largest item's bytes."""
    rng = random.Random(seed)
    examples = [handler.example_input(rng) for _ in range(6)]
    sizes, times = [], []
    start = time.monotonic()
    for rep in range(3):
        if rep and time.monotonic() - start > budget_s:
            break
        for x in examples:
            t0 = time.thread_time()
            size = item_bytes(handler.preprocess(x))
            times.append((time.thread_time() - t0) * 1e3)
            if not rep:
                sizes.append(size)
    need = ITEM_HEADER + max(MIN_SLOT_BYTES, max(sizes) + max(sizes) // 4, int(handler.max_item_bytes))
    return -(-need // 4096) * 4096, statistics.median(times[1:]), max(sizes)


def default_slots(cfg: ServeConfig) -> int:
    """Room in each frontend for the whole --max-queue-size: the kernel spreads connections, not
    requests, so one frontend may hold most of the requests in flight."""
    return min(1024, max(8, 2 * cfg.max_batch_size, cfg.max_queue_size))


class Supervisor:
    def __init__(self, cfg: ServeConfig, cold: ColdStart) -> None:
        import torch

        from netgain.server.bootstrap import build_handler
        from netgain.server.device import resolve_device
        from netgain.server.ports import claim_port

        # NVML answers "is there a GPU" without initialising CUDA, which a fork must not inherit.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        torch.set_num_threads(1)  # sizing below must not start an OpenMP pool before the forks
        self.device = resolve_device(cfg.device)
        self.handler = build_handler(cfg)
        self.handler.check_device(self.device)  # before any port is claimed or process forked
        port = claim_port(cfg.host, cfg.port)
        http_port = cfg.http_port
        if http_port >= 0:  # the frontends all listen on one port: a free one is chosen here
            http_port = claim_port(cfg.host, http_port, flag="--http-port", taken=(port,))
        self.cfg = dataclasses.replace(cfg, port=port, http_port=http_port)
        self.cold = cold
        self.slot_bytes, self.pre_ms, self.item_bytes = measure_items(self.handler, cfg.seed)
        usable = self.usable = os.sched_getaffinity(0)
        self.kept = cfg.resolved_device_cores(len(usable), self.device, self.item_bytes)
        self.device_cpus, self.other_cpus = core_sets(usable, self.kept)
        self.workers, self.pre_processes = cfg.resolved_split(
            len(usable), self.device, self.pre_ms, self.kept
        )
        if cfg.pin_pre_processes and not self.pre_processes:
            raise ValueError(
                f"--pin-pre-processes needs pre-processing processes: this layout has none on {self.device} "
                "(--pre-processes auto starts them only on a GPU); pass --pre-processes 1 or more"
            )
        self.slots = cfg.slots_per_worker or default_slots(cfg)
        self.metrics_port = -1
        self.child_ports: dict[str, int] = {}
        self.exits: list[str] = []
        self.stop = {"signal": 0}  # set by SIGTERM/SIGINT, read by start-up waits and supervision

    # -- start -------------------------------------------------------------------------
    def _fork_all(self) -> None:
        from netgain.server.multiproc.device_proc import DevicePipes, device_main
        from netgain.server.multiproc.frontend import frontend_main
        from netgain.server.multiproc.taker import prep_main

        ctx = mp.get_context("fork")
        _supervisor["pid"] = os.getpid()
        n, npre = self.workers, self.pre_processes
        self.rings = [Ring(self.slots, self.slot_bytes) for _ in range(n)]
        requests = [os.pipe() for _ in range(n + npre)]  # the pre-processing processes hand over too
        replies = [os.pipe() for _ in range(n)]
        work = shared_work_pipe()
        every_fd = [fd for pair in [*requests, *replies, work] for fd in pair]
        dev_keep = [r for r, _ in requests] + [w for _, w in replies]
        self.device_ctl, child = ctx.Pipe()
        _supervisor["ends"] = [self.device_ctl]
        pipes = DevicePipes([r for r, _ in requests], [w for _, w in replies])
        self.device_proc = ctx.Process(
            target=_child,
            args=(
                every_fd,
                dev_keep,
                self.device_cpus,
                device_main,
                (self.cfg, self.device, self.rings, pipes, child),
            ),
            name="netgain-device",
        )
        self.device_proc.start()
        self.fronts: list[Any] = []
        self.front_ctl: list[Connection] = []
        for i in range(n):
            parent, child = ctx.Pipe()
            _supervisor["ends"].append(parent)
            keep = [requests[i][1], replies[i][0], *work]
            fds = (requests[i][1], replies[i][0])
            args = (self.cfg, i, self.device, self.rings, fds, work, npre, child)
            proc = ctx.Process(
                target=_child,
                args=(every_fd, keep, self.other_cpus, frontend_main, args),
                name=f"netgain-frontend-{i}",
            )
            proc.start()
            self.fronts.append(proc)
            self.front_ctl.append(parent)
        self.pres: list[Any] = []
        self.pre_ctl: list[Connection] = []
        for i in range(n, n + npre):  # numbered after the frontends: the claim table names them so
            parent, child = ctx.Pipe()
            _supervisor["ends"].append(parent)
            pre_args = (self.cfg, i, self.device, self.rings, requests[i][1], work, child)
            proc = ctx.Process(
                target=_child,
                args=(every_fd, [requests[i][1], *work], self.pre_cpus(i - n), prep_main, pre_args),
                name=f"netgain-pre-{i}",
            )
            proc.start()
            self.pres.append(proc)
            self.pre_ctl.append(parent)
        for fd in every_fd:  # each end now lives in the one child that uses it: EOF means it exited
            os.close(fd)
        os.sched_setaffinity(0, self.other_cpus)

    def pre_cpus(self, k: int) -> list[int]:
        """Pre-processing process ``k``'s cores: with --pin-pre-processes one of the others' cores,
        the highest-numbered first (the frontends float over them all), else all of them."""
        if not self.cfg.pin_pre_processes:
            return self.other_cpus
        ordered = sorted(self.other_cpus, reverse=True)
        return [ordered[k % len(ordered)]]

    def _wait_message(self, conn: Connection, proc: Any, what: str, timeout_s: float = 600.0) -> Any:
        deadline = time.monotonic() + timeout_s
        ready: list[Any] = []
        while not ready and time.monotonic() < deadline:  # in slices: SIGTERM must not wait out a hang
            if self.stop["signal"]:
                raise ValueError(
                    f"stopped by {signal.Signals(self.stop['signal']).name} while {what} was starting"
                )
            ready = wait([conn, proc.sentinel], min(0.5, max(0.0, deadline - time.monotonic())))
        if conn in ready:
            try:
                kind, payload = conn.recv()
            except EOFError:
                proc.join(1.0)
                kind, payload = "error", f"exited ({exit_status(proc.exitcode)})"
            if kind == "error":
                raise ValueError(f"{what} failed to start: {payload}")
            return payload
        if proc.sentinel in ready:
            proc.join(1.0)
            raise ValueError(f"{what} exited during start-up ({exit_status(proc.exitcode)})")
        raise ValueError(f"{what} did not start within {timeout_s:.0f} s")

    def _start_metrics(self) -> None:
        from prometheus_client import CollectorRegistry

        from netgain.server.bootstrap import serve_metrics
        from netgain.server.multiproc.metrics_merge import MergedCollector
        from netgain.server.telemetry.metrics import ServerMetrics

        self.local = CollectorRegistry()
        self.metrics = ServerMetrics(self.local, self.handler.name, self.device)
        if self.cfg.metrics_port < 0:
            return
        merged = CollectorRegistry()
        merged.register(MergedCollector(self.local, lambda: list(self.child_ports.values())))
        self._httpd, self.metrics_port = serve_metrics(merged, self.cfg.metrics_port, self.cfg.host)

    def _write_ports(self) -> None:
        from netgain.server.bootstrap import write_ports

        write_ports(self.cfg, self.cfg.port, self.metrics_port, self.cfg.http_port)

    def _info(self, device: dict[str, Any]) -> bytes:
        from netgain.contract.cores import describe_cores
        from netgain.server.bootstrap import server_info

        return server_info(
            self.cfg,
            self.handler.name,
            self.device,
            device["versions"],
            self.cold,
            ready=True,
            intra_op_threads=device["intra_op_threads"],
            metrics_port=self.metrics_port,
            workers=self.workers,
            slots_per_worker=self.slots,
            pre_processes=self.pre_processes,
            cores=describe_cores(sorted(self.usable)),  # every process's, the device process's too
        ).SerializeToString()

    def _publish_static(self) -> None:
        from netgain.server.bootstrap import publish_static

        publish_static(self.metrics, self.cfg, self.cold, self.versions.get("torch", ""))

    # -- run ---------------------------------------------------------------------------
    def run(self) -> int:
        stop = self.stop

        def on_signal(signum: int, frame: Any) -> None:
            stop["signal"] = signum

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._fork_all()
        self._start_metrics()
        pinned = " (one core each)" if self.cfg.pin_pre_processes else ""
        pre = f", {self.pre_processes} pre-processing{pinned}" if self.pre_processes else ""
        alone = f" alone on cores {cpu_list(self.device_cpus)}" if self.kept else ""
        loop, _ = eventloop.loop_factory(self.cfg.event_loop)
        say(
            f"{self.workers} frontend{pre} and 1 device process{alone} "
            f"({self.slots} hand-off slots "
            f"of {self.slot_bytes // 1024} KiB per frontend; pre-processing took {self.pre_ms:.2f} ms "
            f"per example item of {self.item_bytes:,} B at start-up; frontends on {loop}'s event loop)"
        )
        try:
            for i, conn in enumerate(self.front_ctl):
                listening = self._wait_message(conn, self.fronts[i], f"frontend {i}")
                self.child_ports[f"front-{i}"] = listening["metrics_port"]
            release_claims()  # every frontend listens: the port check alone refuses it to others now
            for proc, conn in zip(self.pres, self.pre_ctl, strict=True):
                listening = self._wait_message(conn, proc, proc.name)
                self.child_ports[proc.name] = listening["metrics_port"]
            self._write_ports()
            device = self._wait_message(self.device_ctl, self.device_proc, "device process")
        except ValueError:
            self._terminate_all()
            raise
        self.child_ports["device"] = device["metrics_port"]
        self.versions = device["versions"]
        for phase in ("model_built", "on_device", "warmup"):
            if phase in device["marks"]:
                self.cold.mark(phase, device["marks"][phase])
        self.cold.mark("ready")
        self._publish_static()
        info = self._info(device)
        for conn in [*self.pre_ctl, *self.front_ctl]:
            conn.send(("go", info))
        total = self.cold.timeline()[-1][1]
        cores = cpu_list(sorted(self.usable))
        say(f"ready ({self.handler.name} on {self.device}, cold start {total:.2f} s, cores {cores})")
        return self._supervise(stop)

    def _supervise(self, stop: dict[str, int]) -> int:
        alive = {proc.sentinel: i for i, proc in enumerate(self.fronts)}
        pres = {proc.sentinel: proc for proc in self.pres}
        status = 0
        while not stop["signal"]:
            ready = wait([*alive, *pres, self.device_proc.sentinel], 0.2)
            if self.device_proc.sentinel in ready:
                self.device_proc.join(1.0)  # the exit status is known only once joined
                status_text = exit_status(self.device_proc.exitcode)
                say(
                    f"the device process (pid {self.device_proc.pid}) exited ({status_text}); stopping",
                    err=True,
                )
                status = 1
                break
            if self._pre_exited(ready, pres):
                status = 1
                break
            for sentinel in ready:
                if sentinel not in alive:
                    continue
                i = alive.pop(sentinel)
                self.fronts[i].join(1.0)
                self.child_ports.pop(f"front-{i}", None)
                msg = (
                    f"frontend {i} (pid {self.fronts[i].pid}) exited ({exit_status(self.fronts[i].exitcode)})"
                )
                self.exits.append(msg)
                say(f"{msg}; {len(alive)} of {self.workers} frontends still serving", err=True)
            if not alive:
                say("no frontend left; stopping", err=True)
                status = 1
                break
        self._drain()
        return status

    def _pre_exited(self, ready: list[Any], pres: dict[Any, Any]) -> bool:
        """Report pre-processing processes that exited; True when none is left (the frontends take
        no shared work beside them, so requests would wait until their deadlines)."""
        for sentinel in [s for s in ready if s in pres]:
            proc = pres.pop(sentinel)
            proc.join(1.0)
            self.child_ports.pop(proc.name, None)
            msg = f"{proc.name} (pid {proc.pid}) exited ({exit_status(proc.exitcode)})"
            self.exits.append(msg)
            say(f"{msg}; {len(pres)} of {self.pre_processes} pre-processing processes left", err=True)
            if not pres:
                say("no pre-processing process left; stopping", err=True)
                return True
        return False

    def _drain(self) -> None:
        say("draining")
        for proc in self.fronts:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.grace_s + 10.0
        for proc in self.fronts:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
        for conn in self.pre_ctl:  # the frontends' requests are done: stop taking
            with contextlib.suppress(OSError):
                conn.send(("stop", None))
        for proc in self.pres:
            proc.join(max(1.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
        if self.device_proc.is_alive():
            try:
                self.device_ctl.send(("stop", None))
                if self.device_ctl.poll(60.0):
                    self.device_ctl.recv()
            except (EOFError, OSError):
                pass
        self.device_proc.join(10.0)
        if self.device_proc.is_alive():
            self.device_proc.kill()
        httpd = getattr(self, "_httpd", None)
        if httpd is not None:
            httpd.shutdown()
        say("stopped")

    def _terminate_all(self) -> None:
        for proc in [*self.fronts, *self.pres, self.device_proc]:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)


def shared_work_pipe() -> tuple[int, int]:
    """The pipe every frontend writes work records to and every pre-processing thread reads from;
    the writer never blocks (the slots bound what it holds: a full pipe means pre-process here)."""
    import fcntl

    r, w = os.pipe()
    with contextlib.suppress(OSError):  # 1 MiB holds 43,690 records; the default 64 KiB holds 2,730
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    os.set_blocking(w, False)
    return r, w


def exit_status(code: int | None) -> str:
    """A child's exit status in words: "status 1", "killed by SIGSEGV"."""
    if code is None:
        return "status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


# The supervisor's pid and its ends of the control pipes, as the children forked from it see them.
_supervisor: dict[str, Any] = {"pid": 0, "ends": []}
PR_SET_PDEATHSIG = 1


def die_with_supervisor() -> None:
    """In a forked child: the supervisor's death, even by SIGKILL, kills this process too (a
    frontend left behind would go on serving the port with nobody to stop it). The kernel
    signals it (PR_SET_PDEATHSIG); a supervisor already gone before that is seen by its pid.
    The supervisor's ends of the control pipes are closed here, so EOF on ours means it exited."""
    import ctypes

    for conn in _supervisor["ends"]:
        conn.close()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != _supervisor["pid"]:
        os._exit(1)


def _child(every_fd: list[int], keep: list[int], cpus: list[int], target: Any, args: tuple[Any, ...]) -> None:
    """In a forked child: die with the supervisor, close the hand-off pipe ends that belong to
    other processes, move to the role's cores (--device-cores), then run."""
    die_with_supervisor()
    for fd in every_fd:
        if fd not in keep:
            os.close(fd)
    os.sched_setaffinity(0, cpus)
    target(*args)


def run_multiprocess(cfg: ServeConfig, cold: ColdStart) -> int:
    return Supervisor(cfg, cold).run()
