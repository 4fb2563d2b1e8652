"""A frontend process: gRPC on the shared port, and (without --pre-processes) pre-processing for
every frontend.

The servicer is the one-process server's; what it takes for its request queue here is a
``Handoff``. ``put`` reserves one slot per item, writes the raw items into the slots and a
work record to the one pipe that every taker reads (``taker.py``: the frontends' threads, or
the pre-processing processes): whichever is free takes it (the kernel spreads connections over
frontends unevenly, requests are spread evenly), pre-processes in place and hands the request
to the device process. The device's reply wakes the owner's event loop, which post-processes
and answers. Waiting for a taker, the hand-off itself and the reply's return are all part of
``queue``.
An item whose raw form does not fit a slot is pre-processed by the owner's own pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from netgain.server import eventloop
from netgain.server.batching.queue import Pending, QueueClosed, QueueFull
from netgain.server.config import ServeConfig
from netgain.server.handlers.base import Handler, NonFiniteOutput
from netgain.server.multiproc.slots import (
    CODES,
    HANDED,
    MAX_ITEMS_PER_RECORD,
    REPLY,
    TAKER,
    WORK,
    Ring,
    SlotTooSmall,
    encode_request,
)
from netgain.server.multiproc.taker import Taker, preprocess_into, warm_preprocess
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")


class Handoff:
    """The frontend's side of the hand-off; ``put`` and the reply path run on the event loop."""

    def __init__(
        self,
        handler: Handler,
        rings: list[Ring],
        index: int,
        pool: ThreadPoolExecutor,
        work_fds: tuple[int, int] | None,
        request_fd: int,
        reply_fd: int,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.handler = handler
        self.rings = rings
        self.index = index
        self.ring = rings[index]
        self.pool = pool
        self.work_fds = work_fds
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.clock = clock
        self.free: deque[int] = deque(range(self.ring.slots))
        self.pending: dict[int, tuple[Pending, list[int]]] = {}
        self._seq = itertools.count(1)
        self._buf = b""
        self.closed = False
        self.device_gone = False
        self.tracer: Any = None  # a TraceBuilder with --otlp-endpoint (set once tracing is built)
        self.taker = Taker(handler, rings, index, work_fds, request_fd, clock) if work_fds else None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self.pending)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        os.set_blocking(self.reply_fd, False)
        loop.add_reader(self.reply_fd, self._on_replies)

    def close(self) -> None:
        self.closed = True

    def put(self, p: Pending) -> None:
        if self.closed:
            raise QueueClosed("server is shutting down; send to another replica")
        if self.device_gone:
            raise QueueClosed("the device process exited; this server cannot answer")
        n = len(p.inputs)
        if n > len(self.free):
            raise QueueFull(
                f"this frontend's {self.ring.slots} hand-off slots are in use ({len(self.pending)} requests)"
            )
        slots = [self.free.popleft() for _ in range(n)]
        seq = next(self._seq)
        self.pending[seq] = (p, slots)
        if not self._share(p, seq, slots):
            self.pool.submit(self._pre, seq, p, slots)

    def _share(self, p: Pending, seq: int, slots: list[int]) -> bool:
        """Raw items into the slots and a work record to every frontend; False: pre-process here."""
        if self.work_fds is None:
            return False
        try:
            for x, slot in zip(p.inputs, slots, strict=True):
                self.ring.put(slot, x)
        except SlotTooSmall:
            return False
        self.ring.chain(slots, seq)
        try:
            work = WORK.pack(self.index, len(slots), slots[0], seq, p.deadline_ns or 0, *self._trace(p))
            os.write(self.work_fds[1], work)
        except BlockingIOError:
            self.ring.claims[slots[0], TAKER] = HANDED
            return False
        return True

    def _trace(self, p: Pending) -> tuple[bytes, bytes]:
        """The request's trace and span ids when traced (assigned now, kept on the request), so the
        device process's batch span links to the span this frontend exports."""
        if self.tracer is None:
            return b"", b""
        trace_id, span_id, _ = self.tracer.context(p)
        return trace_id, span_id

    def _pre(self, seq: int, p: Pending, slots: list[int]) -> None:
        """On the pool: decode into the slots, then hand the record over."""
        t0 = self.clock()
        items = zip(p.inputs, slots, strict=True)
        code, message = preprocess_into(self.handler, self.ring, items, f"request {p.request_id}")
        t1 = self.clock()
        p.spans["pre"] = t1 - t0
        if code != "OK":
            p.fail(code, message)
            self._call(self._finish, seq)
            return
        try:
            record = encode_request(self.index, seq, p.deadline_ns or 0, t1, 0, slots, trace=self._trace(p))
            os.write(self.request_fd, record)
        except OSError:
            p.fail("UNAVAILABLE", "the device process exited; this server cannot answer")
            self._call(self._finish, seq)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    def _on_replies(self) -> None:
        try:
            data = os.read(self.reply_fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self._device_exited()
            return
        buf = self._buf + data
        at = 0
        while len(buf) - at >= REPLY.size:
            seq, code, batch_id, batch_size, pre, h2d, kernel, d2h, mlen = REPLY.unpack_from(buf, at)
            if len(buf) - at < REPLY.size + mlen:
                break
            message = buf[at + REPLY.size : at + REPLY.size + mlen].decode("utf-8", "replace")
            at += REPLY.size + mlen
            self._reply(seq, CODES[code], message, batch_id, batch_size, (pre, h2d, kernel, d2h))
        self._buf = buf[at:]

    def _reply(
        self, seq: int, code: str, message: str, batch_id: int, size: int, spans: tuple[int, int, int, int]
    ) -> None:
        entry = self.pending.get(seq)
        if entry is None:
            return
        p, slots = entry
        now = self.clock()  # post starts here: the post-processing below is the frontend's post
        s = p.spans
        s["pre"] = s.get("pre", 0) + spans[0]
        s["h2d"], s["kernel"], s["d2h"] = spans[1:]
        p.batch_id, p.batch_size = batch_id, size
        if code != "OK":
            p.fail(code, message)
        else:
            try:
                p.outputs = [self.handler.postprocess(self.ring.get(slot)) for slot in slots]
            except NonFiniteOutput as exc:  # the input drove the model out of range: the caller's to fix
                p.fail("INVALID_ARGUMENT", str(exc))
            except Exception as exc:
                log.exception("postprocess failed for request %s", p.request_id)
                p.fail("INTERNAL", f"postprocess error: {type(exc).__name__}: {exc}")
        self._finish(seq, now)

    def _finish(self, seq: int, post_start_ns: int | None = None) -> None:
        p, slots = self.pending.pop(seq)
        self.free.extend(slots)
        now = self.clock() if post_start_ns is None else post_start_ns
        s = p.spans
        for phase in ("pre", "h2d", "kernel", "d2h"):
            s.setdefault(phase, 0)
        # Everything between arrival and post that no stage measured was waiting: queue.
        s["queue"] = max(0, now - p.arrival_ns - s["pre"] - s["h2d"] - s["kernel"] - s["d2h"])
        p.post_start_ns = now
        fut = p.future
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _device_exited(self) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self.reply_fd)
        self.device_gone = True
        for seq in list(self.pending):
            p, _ = self.pending[seq]
            if p.code == "OK":
                p.fail("UNAVAILABLE", "the device process exited; this server cannot answer")
            self._finish(seq)


class Frontend:
    def __init__(
        self,
        cfg: ServeConfig,
        index: int,
        device: str,
        rings: list[Ring],
        fds: tuple[int, int],
        work_fds: tuple[int, int] | None,
        pre_processes: int = 0,
    ) -> None:
        import torch

        from netgain.server.bootstrap import build_handler

        torch.set_num_threads(1)  # one thread per pre-processing thread: torch's default oversubscribes
        self.cfg = cfg
        self.index = index
        self.device = device
        self.pre_processes = pre_processes  # > 0: they take the shared work, this frontend's threads do not
        self.handler = build_handler(cfg)
        self.pool = ThreadPoolExecutor(
            cfg.pre_threads, thread_name_prefix="netgain-prepost", initializer=name_os_thread
        )
        self.handoff = Handoff(self.handler, rings, index, self.pool, work_fds, fds[0], fds[1])
        self.info_message: Any = None

    def warm(self) -> None:
        warm_preprocess(self.handler, self.cfg)

    def info(self) -> Any:
        from netgain.protos import inference_pb2 as pb

        out = pb.ServerInfoResponse()
        if self.info_message is not None:
            out.CopyFrom(self.info_message)
        out.ready = self.servicer.ready
        return out

    def _no_profile(self, batches: int, ranges_only: bool = False) -> Any:
        if not self.cfg.profile_dir:
            raise ValueError("profiling is off: start the server with --profile-dir DIR")
        raise ValueError("profile captures need the one-process server: serve with --workers 0")

    async def serve(self, ctl: Any) -> int:
        from netgain.protos import inference_pb2 as pb
        from netgain.server.bootstrap import (
            build_servicer,
            build_telemetry,
            drain,
            new_health,
            oip_io,
            set_health,
            start_grpc,
        )
        from netgain.server.multiproc.metrics_merge import serve_families

        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self.handoff.attach(loop)
        # Runs no model: no instances to sample; each request's phases are recorded here.
        tel = build_telemetry(
            cfg, self.handler.name, self.device, runs_model=False, span_log=True, per_request_phases=True
        )
        metrics = tel.metrics
        self.handoff.tracer = tel.tracer
        max_items = min(cfg.max_items_per_request, self.handoff.ring.slots, MAX_ITEMS_PER_RECORD)
        self.servicer = build_servicer(
            cfg, self.handler.name, self.handoff, tel, max_items, self.info, self._no_profile
        )
        health_servicer = new_health()
        io = oip_io(cfg)
        server, _ = await start_grpc(cfg, self.servicer, health_servicer, io)
        http = None
        if cfg.http_port >= 0:  # the supervisor resolved the port; every frontend listens on it
            from netgain.server.rest.endpoint import start_http

            http = await start_http(cfg, self.servicer, io, reuse_port=True)
        metrics_port = -1
        if cfg.metrics_port >= 0:
            _, metrics_port = serve_families(tel.registry)
        metrics.in_flight.labels(**metrics.labels).set_function(lambda: self.servicer.in_flight)
        metrics.queue_depth.labels(**metrics.labels).set_function(lambda: 0)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await asyncio.to_thread(self.warm)
        gc.collect()
        gc.freeze()  # torch's and the handler's objects: a full collection no longer walks them
        ctl.send(("listening", {"metrics_port": metrics_port, "pid": os.getpid()}))
        go = asyncio.ensure_future(asyncio.to_thread(_recv, ctl))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({go, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if go.done() and go.result() is not None:
            self.info_message = pb.ServerInfoResponse.FromString(go.result())
            tel.start()
            if self.handoff.taker is not None and not self.pre_processes:
                self.handoff.taker.start(cfg.pre_threads)
            self.servicer.ready = True
            await set_health(health_servicer, True)
            await stopped
        # Drain: refuse new requests at once, finish those in flight, then leave.
        self.handoff.close()
        await drain(server, self.servicer, health_servicer, cfg.grace_s)
        if http is not None:
            await http.close()
        if self.handoff.taker is not None:
            await asyncio.to_thread(self.handoff.taker.stop)
        tel.stop()
        self.pool.shutdown(wait=True)
        return 0


def _recv(ctl: Any) -> Any:
    try:
        kind, payload = ctl.recv()
    except (EOFError, OSError):
        return None
    return payload if kind == "go" else None


def frontend_main(
    cfg: ServeConfig,
    index: int,
    device: str,
    rings: list[Ring],
    fds: tuple[int, int],
    work_fds: tuple[int, int] | None,
    pre_processes: int,
    ctl: Any,
) -> None:
    """Entry point in a forked frontend process."""
    import sys

    import grpc  # noqa: F401 - before the event loop: grpc.aio needs its module state

    name_os_thread(f"netgain-front-{index}")
    os.nice(cfg.worker_nice)  # the device process's kernel launches go first when cores are short
    sys.setswitchinterval(cfg.switch_interval_ms / 1e3)
    try:
        front = Frontend(cfg, index, device, rings, fds, work_fds, pre_processes)
        code = eventloop.run(front.serve(ctl), cfg.event_loop)
    except Exception as exc:
        log.exception("frontend %d failed", index)
        with contextlib.suppress(OSError):
            ctl.send(("error", f"frontend {index}: {type(exc).__name__}: {exc}"))
        code = 1
    os._exit(code)
