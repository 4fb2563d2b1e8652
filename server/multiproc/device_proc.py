"""The device process: one per server, batching items that every frontend handed over.

It reads request records from each frontend's pipe, batches across frontends with the same
queue and pipeline as the one-process server (its ``pre`` stage gathers the items from
their slots and collates them), runs the forward pass and writes each item's output row
back into its slot, then a reply record to the frontend that owns it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import selectors
import signal
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from netgain.server.batching.pipeline import Batch, Pipeline, PipelineConfig
from netgain.server.batching.queue import Pending, QueueClosed, QueueFull, RequestQueue
from netgain.server.config import ServeConfig
from netgain.server.handlers.base import Handler
from netgain.server.multiproc.slots import (
    CODES,
    HANDED,
    REQUEST,
    SEQ,
    TAKER,
    Ring,
    SlotRef,
    SlotTooSmall,
    encode_reply,
)
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")


@dataclass(eq=False)
class Handed(Pending):
    """A request as the device process sees it: its items are slots of one frontend's ring."""

    frontend: int = 0
    seq: int = 0
    front_pre_ns: int = 0  # the frontend's pre-processing, added to the batch's collate in the reply


def intra_op_threads(cfg: ServeConfig, device: str, frontends: int) -> int:
    """--intra-op-threads, or by default: on a GPU one (the forward needs none, and idle OpenMP
    workers spin on the cores the frontends pre-process on); on the CPU the cores the frontends
    leave, so model compute and pre-processing do not oversubscribe."""
    cores = len(os.sched_getaffinity(0))
    if cfg.intra_op_threads:
        return cfg.intra_op_threads
    if device.startswith("cuda"):
        return 1
    alone = isinstance(cfg.device_cores, int) and cfg.device_cores > 0
    return cores if alone else max(1, cores - frontends)  # alone: its cores are its own


class SlotHandler(Handler):
    """The user's handler, with items read from slots and output rows returned as they are."""

    def __init__(self, inner: Handler, rings: list[Ring], staging: int = 0, max_rows: int = 0) -> None:
        super().__init__(inner.options, inner.seed)
        self.inner = inner
        self.rings = rings
        self.name = inner.name
        self.uses_device = inner.uses_device
        self.fixed_shapes = inner.fixed_shapes
        self.host_inputs = inner.host_inputs
        # Items are stacked straight into pinned buffers, reused round-robin: a buffer is reused
        # only after ``staging`` later batches, more than the pipeline lets into flight at once.
        # Host inputs are not stacked: the handler's forward copies them from the slots.
        plain = type(inner).collate is Handler.collate and not inner.host_inputs
        self.staging = staging if plain else 0
        self.max_rows = max_rows
        self._buffers: dict[tuple[Any, ...], list[Any]] = {}
        self._turn = 0
        self._lock = threading.Lock()

    def preprocess(self, item: Any) -> Any:
        return self.rings[item.frontend].get(item.slot)

    def collate(self, items: list[Any]) -> Any:
        import torch

        first = items[0] if items else None
        if not self.staging or not isinstance(first, torch.Tensor) or len(items) > self.max_rows:
            return self.inner.collate(items)
        key = (tuple(first.shape), first.dtype)
        with self._lock:
            ring = self._buffers.get(key)
            if ring is None:
                shape = (self.max_rows, *first.shape)
                ring = [torch.empty(shape, dtype=first.dtype, pin_memory=True) for _ in range(self.staging)]
                self._buffers[key] = ring
            self._turn += 1
            buf = ring[self._turn % len(ring)][: len(items)]
        torch.stack(items, out=buf)
        return buf

    def forward(self, model: Any, batch: Any) -> Any:
        return self.inner.forward(model, batch)

    def postprocess(self, row: Any) -> Any:
        return row


@dataclass
class DevicePipes:
    requests: list[int]  # read ends, one per frontend
    replies: list[int]  # write ends, one per frontend


class DeviceProcess:
    def __init__(self, cfg: ServeConfig, device: str, rings: list[Ring], pipes: DevicePipes) -> None:
        self.cfg = cfg
        self.device = device
        self.rings = rings
        self.pipes = pipes
        self.marks: dict[str, float] = {}

    def load(self) -> None:
        """Build, place and warm the model (the device part of the cold start)."""
        import torch

        from netgain.server.bootstrap import build_handler, build_runners, warm_up

        cfg = self.cfg
        torch.set_num_threads(intra_op_threads(cfg, self.device, len(self.pipes.requests)))
        self.handler = build_handler(cfg)
        self.runners = build_runners(self.handler, self.device, cfg)
        for runner in self.runners:
            runner.place(self.handler.build_model())
            self.marks.setdefault("model_built", time.time())
            self.marks["on_device"] = time.time()
        for runner in self.runners:
            warm_up(self.handler, runner, cfg)
        self.marks["warmup"] = time.time()

    def start(self, metrics_port: bool) -> dict[str, Any]:
        import torch

        from netgain.server.bootstrap import build_telemetry, versions
        from netgain.server.multiproc.metrics_merge import serve_families

        cfg = self.cfg
        # No span log here: the frontends write each request's spans.
        self.telemetry = build_telemetry(cfg, self.handler.name, self.device, runs_model=True, span_log=False)
        self.metrics, self.recorder = self.telemetry.metrics, self.telemetry.recorder
        self.requests = RequestQueue(cfg.max_queue_size)  # the server-wide bound, over every frontend
        threads = max(2, cfg.pre_threads)  # gathering items from slots and collating: no decode here
        staging = len(self.runners) + threads + 2 if self.device.startswith("cuda") else 0
        self.pipeline = Pipeline(
            SlotHandler(self.handler, self.rings, staging, cfg.max_batch_size),
            self.runners,
            self.requests,
            PipelineConfig(cfg.max_batch_size, cfg.max_queue_delay_ms, threads, trailers=False),
            self.deliver,
            self._on_batch,
        )
        m = self.metrics
        m.queue_depth.labels(**m.labels).set_function(lambda: len(self.requests))
        port = -1
        if metrics_port:
            self._httpd, port = serve_families(self.telemetry.registry)
        self.pipeline.start()
        self.telemetry.start()
        threading.Thread(target=self._read, name="netgain-handoff", daemon=True).start()
        gc.collect()
        gc.freeze()  # the model and torch's objects: a full collection no longer walks them
        return {
            "marks": self.marks,
            "metrics_port": port,
            "intra_op_threads": int(torch.get_num_threads()),
            "device": self.device,
            "pid": os.getpid(),
            "versions": versions(),
        }

    def _on_batch(self, batch: Batch, result: Any) -> None:
        size = batch.rows[-1][2] if batch.rows else 0
        # Phase histograms are the frontends' (they see each request whole): batch metrics only here.
        kernel_ns = result.kernel_ns if result is not None else 0
        self.recorder.batch_done(size, kernel_ns, ())
        self.recorder.trace_batch(batch.requests, size, kernel_ns)

    def _read(self) -> None:
        """One thread reads every frontend's pipe (threads per frontend would contend for the GIL)."""
        name_os_thread()
        sel = selectors.DefaultSelector()
        for writer, fd in enumerate(self.pipes.requests):
            sel.register(fd, selectors.EVENT_READ, writer)
        pending: dict[int, bytes] = {}
        while sel.get_map():
            for key, _ in sel.select():
                writer, fd = key.data, key.fd
                data = os.read(fd, 1 << 16)  # every record waiting, in one call
                if not data:
                    sel.unregister(fd)  # that process exited; replies to a frontend gone are dropped
                    self._orphans(writer)
                    continue
                buf, at = pending.pop(fd, b"") + data, 0
                while len(buf) - at >= REQUEST.size:
                    head = REQUEST.unpack_from(buf, at)
                    end = at + REQUEST.size + 4 * head[2] + head[7]  # slots, then the message
                    if end > len(buf):
                        break
                    self._take(head, buf[at + REQUEST.size : end])
                    at = end
                if at < len(buf):
                    pending[fd] = buf[at:]

    def _take(self, head: tuple[Any, ...], body: bytes) -> None:
        """One request record (its head unpacked, then its slots and message): into the queue, or
        answered at once (failed pre-processing, full queue)."""
        origin, code, n, seq, deadline_ns, handed_ns, pre_ns, _, trace_id, span_id = head
        slots = struct.unpack_from(f"<{n}I", body)
        p = Handed(
            f"f{origin}-{seq}",
            [SlotRef(origin, s) for s in slots],
            handed_ns,
            deadline_ns or None,
            frontend=origin,
            seq=seq,
            front_pre_ns=pre_ns,
        )
        if any(trace_id):  # the owner's ids for this request: its batch span links to them
            p.trace = (trace_id, span_id, b"")
        if code:  # pre-processing failed where it was taken: answer the owner
            p.fail(CODES[code], body[4 * n :].decode("utf-8", "replace"))
            self.deliver([p])
            return
        try:
            self.requests.put(p)
        except QueueFull as exc:
            p.fail("RESOURCE_EXHAUSTED", f"{exc}; request shed, retry later")
            self.deliver([p])
        except QueueClosed as exc:
            p.fail("UNAVAILABLE", str(exc))
            self.deliver([p])

    def _orphans(self, dead: int) -> None:
        """Answer the requests a frontend that exited had taken but not handed on (their owners
        would otherwise wait for them until the client's deadline). Writers after the frontends
        (one ring each) are pre-processing processes."""
        who = f"frontend {dead}" if dead < len(self.rings) else f"pre-processing process {dead}"
        for origin, ring in enumerate(self.rings):
            if origin == dead:
                continue
            for first in np.flatnonzero(ring.claims[:, TAKER] == dead):
                seq = int(ring.claims[first, SEQ])
                p = Handed(f"f{origin}-{seq}", [], 0, None, frontend=origin, seq=seq)
                ring.claims[first, TAKER] = HANDED
                p.fail("UNAVAILABLE", f"{who} exited while pre-processing this request; retry")
                self.deliver([p])

    def deliver(self, reqs: list[Pending]) -> None:
        """From pipeline threads: output rows into their slots, then the reply records, written
        together per frontend (one wake-up of its event loop per batch, not per request)."""
        out: dict[int, list[bytes]] = {}
        for p in reqs:
            assert isinstance(p, Handed)
            code, message = p.code, p.message
            if code == "OK":
                try:
                    for ref, row in zip(p.inputs, p.outputs, strict=True):
                        self.rings[ref.frontend].put(ref.slot, row)
                except (SlotTooSmall, ValueError) as exc:
                    code, message = "INTERNAL", f"output row: {exc}"
            s = p.spans
            spans = (s.get("pre", 0) + p.front_pre_ns, s.get("h2d", 0), s.get("kernel", 0), s.get("d2h", 0))
            out.setdefault(p.frontend, []).append(
                encode_reply(p.seq, code, max(0, p.batch_id), p.batch_size, spans, message)
            )
        for frontend, records in out.items():
            fd = self.pipes.replies[frontend]
            with contextlib.suppress(OSError):  # that frontend is gone: nobody waits for these replies
                for chunk in atomic_chunks(records):
                    os.write(fd, chunk)

    def stop(self) -> None:
        self.requests.close()
        self.pipeline.stop()
        self.telemetry.stop()
        httpd = getattr(self, "_httpd", None)
        if httpd is not None:
            httpd.shutdown()


def atomic_chunks(records: list[bytes]) -> list[bytes]:
    """Whole records joined into writes of at most PIPE_BUF bytes: each is atomic, so the
    records of threads that deliver at the same time never interleave."""
    chunks: list[bytes] = []
    cur: list[bytes] = []
    size = 0
    for rec in records:
        if cur and size + len(rec) > select.PIPE_BUF:
            chunks.append(b"".join(cur))
            cur, size = [], 0
        cur.append(rec)
        size += len(rec)
    if cur:
        chunks.append(b"".join(cur))
    return chunks


def device_main(cfg: ServeConfig, device: str, rings: list[Ring], pipes: DevicePipes, ctl: Any) -> None:
    """Entry point in the forked device process; the supervisor stops it over ``ctl``."""
    # Ctrl-C reaches the whole process group: the frontends drain first, then the supervisor stops this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name_os_thread("netgain-device")
    proc = DeviceProcess(cfg, device, rings, pipes)
    try:
        proc.load()
        ctl.send(("ready", proc.start(cfg.metrics_port >= 0)))
    except Exception as exc:
        log.exception("device process failed to start")
        ctl.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    with contextlib.suppress(EOFError, OSError):  # "stop", or EOF when the supervisor died
        ctl.recv()
    proc.stop()
    with contextlib.suppress(OSError):
        ctl.send(("stopped", None))
