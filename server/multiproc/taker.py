"""Taking shared work: pre-processing any frontend's request in place in its slots.

Every frontend writes a work record for each request to one pipe. A ``Taker`` reads records
from it, pre-processes the request's raw items where they lie and hands the request to the
device process. Takers run as threads of a frontend (``--pre-processes 0``) or alone in a
process that does nothing else (``--pre-processes N``): there they share no interpreter with a
gRPC event loop, so the GIL hands-off between the two cost nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from netgain.server.handlers.base import Handler, InvalidInput
from netgain.server.multiproc.slots import HANDED, TAKER, WORK, Ring, SlotTooSmall, encode_request
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")


def preprocess_into(
    handler: Handler, ring: Ring, items: Iterable[tuple[Any, int]], what: str
) -> tuple[str, str]:
    """Pre-process each (raw item, slot) into its slot: ("OK", "") or the failure's code and message."""
    try:
        for x, slot in items:
            ring.put(slot, handler.preprocess(x))
    except InvalidInput as exc:
        return "INVALID_ARGUMENT", str(exc)
    except SlotTooSmall as exc:
        return "RESOURCE_EXHAUSTED", f"pre-processed item: {exc}"
    except Exception as exc:
        log.exception("preprocess failed for %s", what)
        return "INTERNAL", f"preprocess error: {type(exc).__name__}: {exc}"
    return "OK", ""


def warm_preprocess(handler: Handler, cfg: Any) -> None:
    """Pre-process a few example items (--warmup-batches) before the process reports ready."""
    import random

    rng = random.Random(cfg.seed)
    for _ in range(max(1, cfg.warmup_batches)):
        handler.preprocess(handler.example_input(rng))


class Taker:
    """Reads work records and pre-processes them; ``index`` is who the claim table names."""

    def __init__(
        self,
        handler: Handler,
        rings: list[Ring],
        index: int,
        work_fds: tuple[int, int],
        request_fd: int,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.handler = handler
        self.rings = rings
        self.index = index
        self.work_fds = work_fds
        self.request_fd = request_fd
        self.clock = clock
        self.taking = True
        self._busy = 0
        self._busy_lock = threading.Lock()

    def start(self, threads: int) -> None:
        for i in range(threads):
            threading.Thread(target=self._take_loop, name=f"netgain-prepost-take{i}", daemon=True).start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Take no more work; wait for the records being pre-processed here to be handed on."""
        self.taking = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._busy_lock:
                if not self._busy:
                    break
            time.sleep(0.005)
        time.sleep(0.05)  # a read that returns now gives its record back (see _take_loop)

    def _take_loop(self) -> None:
        name_os_thread()
        work_r, work_w = self.work_fds
        while True:
            try:
                rec = os.read(work_r, WORK.size)  # records are written whole: a read takes exactly one
            except OSError:
                return
            if len(rec) != WORK.size:
                return
            with self._busy_lock:
                if not self.taking:
                    with contextlib.suppress(OSError):
                        os.write(work_w, rec)  # leaving: another taker has it
                    return
                self._busy += 1
            try:
                self._take(*WORK.unpack(rec))
            except Exception:  # a bug here must not end the thread that serves every frontend
                log.exception("shared pre-processing failed")
            finally:
                with self._busy_lock:
                    self._busy -= 1

    def _take(
        self, origin: int, n: int, first: int, seq: int, deadline: int, trace_id: bytes, span_id: bytes
    ) -> None:
        ring = self.rings[origin]
        ring.claims[first, TAKER] = self.index
        slots = ring.chained(first, n)
        t0 = self.clock()
        items = ((ring.get(slot), slot) for slot in slots)
        code, message = preprocess_into(self.handler, ring, items, f"a request of frontend {origin}")
        t1 = self.clock()
        record = encode_request(origin, seq, deadline, t1, t1 - t0, slots, code, message, (trace_id, span_id))
        try:
            os.write(self.request_fd, record)
        finally:
            ring.claims[first, TAKER] = HANDED


def prep_main(
    cfg: Any, index: int, device: str, rings: list[Ring], request_fd: int, work_fds: tuple[int, int], ctl: Any
) -> None:
    """Entry point of a forked pre-processing process: one taker thread, one torch thread; the
    supervisor stops it over ``ctl`` once the frontends have drained."""
    import torch
    from prometheus_client import CollectorRegistry

    from netgain.server.bootstrap import build_handler
    from netgain.server.multiproc.metrics_merge import serve_families
    from netgain.server.telemetry.metrics import ServerMetrics
    from netgain.server.telemetry.samplers import Sampler

    # Ctrl-C reaches the process group: the frontends drain first, then the supervisor stops this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name_os_thread(f"netgain-pre-{index}")
    os.nice(cfg.worker_nice)  # the device process's kernel launches go first when cores are short
    try:
        torch.set_num_threads(1)
        handler = build_handler(cfg)
        warm_preprocess(handler, cfg)
        metrics_port = -1
        sampler = None
        if cfg.metrics_port >= 0:  # this process's CPU, merged into the server's one /metrics
            registry = CollectorRegistry()
            metrics = ServerMetrics(registry, handler.name, device)
            _, metrics_port = serve_families(registry)
            sampler = Sampler(metrics, 0, None, cfg.sample_interval_s)
        taker = Taker(handler, rings, index, work_fds, request_fd)
        ctl.send(("listening", {"metrics_port": metrics_port, "pid": os.getpid()}))
    except Exception as exc:
        log.exception("pre-processing process %d failed", index)
        with contextlib.suppress(OSError):
            ctl.send(("error", f"pre-processing process {index}: {type(exc).__name__}: {exc}"))
        os._exit(1)
    with contextlib.suppress(EOFError, OSError):
        kind, _ = ctl.recv()
        if kind == "go":
            if sampler is not None:
                sampler.start()
            taker.start(1)
            ctl.recv()  # "stop", or EOF when the supervisor died
    taker.stop()
    if sampler is not None:
        sampler.stop()
    os._exit(0)
