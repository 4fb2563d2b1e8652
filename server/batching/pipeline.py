"""The serving pipeline: batcher → pre-processing pool → device workers → post-processing.

Pre-processing of batch N+1 runs on the pool while a device worker runs batch N;
a semaphore bounds the batches in flight, so when the device is the bottleneck
requests wait in the request queue (where they form bigger batches or are shed)
instead of piling up unseen between stages.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from netgain.contract.phases import batch_phases_part, trailer_head
from netgain.server.batching.profile import ProfileCapture
from netgain.server.batching.queue import Pending, RequestQueue
from netgain.server.device import DeviceOutOfMemory, DeviceRunner
from netgain.server.handlers.base import Handler, InvalidInput, NonFiniteOutput
from netgain.server.threadnames import name_os_thread

log = logging.getLogger("netgain.server")

Deliver = Callable[[list[Pending]], None]


@dataclass
class Batch:
    batch_id: int
    requests: list[Pending]
    formed_ns: int
    tensor: Any = None
    rows: list[tuple[Pending, int, int]] = field(default_factory=list)  # request, first row, end row
    pre_end_ns: int = 0
    device_end_ns: int = 0


@dataclass
class PipelineConfig:
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    pre_threads: int = 2
    trailers: bool = True  # format the server-timing trailer's head on the pipeline's threads


class Pipeline:
    def __init__(
        self,
        handler: Handler,
        runners: list[DeviceRunner],
        requests: RequestQueue,
        config: PipelineConfig,
        deliver: Deliver,
        on_batch: Callable[[Batch, Any], None] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.handler = handler
        self.runners = runners
        self.requests = requests
        self.config = config
        self.deliver = deliver
        self.on_batch = on_batch
        self.clock = clock
        self._ids = itertools.count(1)
        self._slots = threading.Semaphore(len(runners) + config.pre_threads)
        self._device_q: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(
            config.pre_threads, thread_name_prefix="netgain-prepost", initializer=name_os_thread
        )
        self._threads: list[threading.Thread] = []
        self._profile: ProfileCapture | None = None
        self._profile_lock = threading.Lock()
        self.in_flight = 0

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._threads.append(threading.Thread(target=self._batch_loop, name="netgain-batcher", daemon=True))
        for i, runner in enumerate(self.runners):
            t = threading.Thread(
                target=self._device_loop, args=(runner,), name=f"netgain-device-{i}", daemon=True
            )
            self._threads.append(t)
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish everything queued, then stop the threads (the request queue must be closed first)."""
        self.requests.close()
        self._threads[0].join(timeout_s)
        # Wait for batches in flight, then stop the device workers.
        for _ in range(len(self.runners) + self.config.pre_threads):
            self._slots.acquire(timeout=timeout_s)
        for _ in self.runners:
            self._device_q.put(None)
        for t in self._threads[1:]:
            t.join(timeout_s)
        self._pool.shutdown(wait=True)

    def request_profile(self, batches: int, path: str, ranges_only: bool = False) -> ProfileCapture:
        with self._profile_lock:
            if self._profile is not None and not self._profile.closed.is_set():
                raise RuntimeError("a profile capture is already running")
            self._profile = ProfileCapture(batches, path, self.runners[0].is_cuda, ranges_only)
            return self._profile

    # -- stages ------------------------------------------------------------------
    def _batch_loop(self) -> None:
        name_os_thread()
        delay_ns = int(self.config.max_queue_delay_ms * 1e6)
        while True:
            self._slots.acquire()
            reqs = self.requests.take_batch(self.config.max_batch_size, delay_ns)
            if reqs is None:
                self._slots.release()
                return
            now = self.clock()
            live: list[Pending] = []
            expired: list[Pending] = []
            for p in reqs:
                p.spans["queue"] = now - p.arrival_ns
                if p.deadline_ns is not None and p.deadline_ns <= now:
                    p.fail("DEADLINE_EXCEEDED", "deadline passed while queued; dropped before compute")
                    expired.append(p)
                else:
                    live.append(p)
            if expired:
                self._finish(expired, -1, 0, now)
            if not live:
                self._slots.release()
                continue
            batch = Batch(next(self._ids), live, now)
            self._pool.submit(self._guard, self._pre, batch)

    def _guard(self, fn: Callable[[Batch], None], batch: Batch) -> None:
        try:
            fn(batch)
        except Exception as exc:  # a bug in a stage must not strand requests
            self._slots.release()
            self._fail_stage(batch, exc, len(batch.requests))

    def _fail_stage(self, batch: Batch, exc: Exception, size: int) -> None:
        """Called inside an ``except``: log, fail the batch's requests still OK, hand them back."""
        log.exception("pipeline stage failed for batch %d", batch.batch_id)
        for p in batch.requests:
            if p.code == "OK":
                p.fail("INTERNAL", f"server error: {type(exc).__name__}: {exc}")
        self._finish(batch.requests, batch.batch_id, size, self.clock())

    def _pre(self, batch: Batch) -> None:
        t0 = self.clock()
        items: list[Any] = []
        ok: list[Pending] = []
        failed: list[Pending] = []
        for p in batch.requests:
            try:
                mine = [self.handler.preprocess(x) for x in p.inputs]
            except InvalidInput as exc:
                p.fail("INVALID_ARGUMENT", str(exc))
                failed.append(p)
                continue
            except Exception as exc:
                log.exception("preprocess failed for request %s", p.request_id)
                p.fail("INTERNAL", f"preprocess error: {type(exc).__name__}: {exc}")
                failed.append(p)
                continue
            batch.rows.append((p, len(items), len(items) + len(mine)))
            items.extend(mine)
            ok.append(p)
        if ok:
            batch.tensor = self.runners[0].prepare(self.handler.collate(items))
        batch.pre_end_ns = self.clock()
        pre_ns = batch.pre_end_ns - t0
        size = len(items)
        for p in batch.requests:
            p.spans["pre"] = pre_ns
            p.spans["queue"] += t0 - batch.formed_ns
        if failed:
            self._finish(failed, batch.batch_id, size, batch.pre_end_ns)
        if not ok:
            self._slots.release()
            return
        batch.requests = ok
        self._device_q.put(batch)

    def _device_loop(self, runner: DeviceRunner) -> None:
        name_os_thread()
        while True:
            batch = self._device_q.get()
            if batch is None:
                return
            start = self.clock()
            result: Any = None
            try:
                result = self._run_device(runner, batch)
            except DeviceOutOfMemory as exc:
                for p in batch.requests:
                    p.fail("RESOURCE_EXHAUSTED", f"{exc}; retry with fewer items")
            except Exception as exc:
                log.exception("forward failed for batch %d", batch.batch_id)
                for p in batch.requests:
                    p.fail("INTERNAL", f"forward error: {type(exc).__name__}: {exc}")
            batch.device_end_ns = self.clock()
            self._slots.release()
            for p in batch.requests:
                p.spans["queue"] += start - batch.pre_end_ns
                if result is not None:
                    p.spans["h2d"], p.spans["kernel"], p.spans["d2h"] = (
                        result.h2d_ns,
                        result.kernel_ns,
                        result.d2h_ns,
                    )
                    # Host time in the device stage that the device spans do not cover (mostly
                    # waiting to re-take the GIL after the sync) is waiting: charged to queue.
                    device_ns = result.h2d_ns + result.kernel_ns + result.d2h_ns
                    p.spans["queue"] += max(0, batch.device_end_ns - start - device_ns)
                else:
                    p.spans["kernel"] = batch.device_end_ns - start
            self._pool.submit(self._guard_post, batch, result)

    def _run_device(self, runner: DeviceRunner, batch: Batch) -> Any:
        capture = self._profile if runner is self.runners[0] else None
        if capture is None or not capture.started.is_set() or capture.done.is_set():
            return runner.run(batch.tensor)
        return capture.run(batch.batch_id, lambda: runner.run(batch.tensor))

    def _guard_post(self, batch: Batch, result: Any) -> None:
        try:
            self._post(batch, result)
        except Exception as exc:
            self._fail_stage(batch, exc, len(batch.rows))

    def _post(self, batch: Batch, result: Any) -> None:
        t0 = self.clock()
        size = batch.rows[-1][2] if batch.rows else 0
        invalid = result.invalid if result is not None else {}
        for p, first, end in batch.rows:
            p.spans["queue"] += t0 - batch.device_end_ns
            if result is None or p.code != "OK":
                continue
            bad = next((invalid[i] for i in range(first, end) if i in invalid), None) if invalid else None
            if bad is not None:  # an item the forward pass found invalid (e.g. a corrupt JPEG body)
                p.fail("INVALID_ARGUMENT", bad)
                continue
            try:
                p.outputs = [self.handler.postprocess(result.output[i]) for i in range(first, end)]
            except NonFiniteOutput as exc:  # the input drove the model out of range: the caller's to fix
                p.fail("INVALID_ARGUMENT", str(exc))
            except Exception as exc:
                log.exception("postprocess failed for request %s", p.request_id)
                p.fail("INTERNAL", f"postprocess error: {type(exc).__name__}: {exc}")
        if self.on_batch is not None:
            self.on_batch(batch, result)
        # Last, so that nothing this thread runs competes for the GIL with the event loop it wakes.
        self._finish(batch.requests, batch.batch_id, size, t0)

    def _finish(self, reqs: list[Pending], batch_id: int, size: int, post_start_ns: int) -> None:
        """Hand finished requests back. Each stage sets the batch-wide phases for a whole batch, so
        they are formatted once per distinct set (once per call in practice)."""
        parts: dict[tuple[int, ...], str] = {}
        trailers = self.config.trailers
        for p in reqs:
            p.batch_id = batch_id
            p.batch_size = size
            p.post_start_ns = post_start_ns
            spans = p.spans
            for phase in ("pre", "h2d", "kernel", "d2h"):
                spans.setdefault(phase, 0)
            if trailers:
                key = (spans["pre"], spans["h2d"], spans["kernel"], spans["d2h"])
                part = parts.get(key)
                if part is None:
                    part = parts[key] = batch_phases_part(*key)
                p.timing_head = trailer_head(spans["queue"], part)
        self.deliver(reqs)
