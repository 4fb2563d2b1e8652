"""The sender engine of one load-generator worker: asyncio in a process without gevent, sending
with the run's protocol's ``Sender`` (grpc.aio, or HTTP/1.1: ``sender``).

The Locust worker (gevent) relays between the master and this process over a pipe pair (see
``frames``). Sending here rather than in the worker avoids gRPC's gevent integration, which hands
every blocking call to a thread pool and back and made a worker fall milliseconds behind its
schedule at ~1,000 req/s on one core.

Each request goes out at its scheduled time as its own task, whether or not earlier ones
returned; a cap on requests in flight turns overflow into DROPPED rows, never silent delay.
Times are ``perf_counter_ns`` aligned once to the master's epoch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import fcntl
import logging
import math
import os
import selectors
import sys
import threading
import time
from typing import IO, Any

import numpy as np

from netgain.contract.messages import Plan
from netgain.contract.records import empty_columns
from netgain.loadgen.runner import frames
from netgain.loadgen.runner.sender import ANSWER_COLUMNS, make_sender

log = logging.getLogger("netgain.loadgen")
FLUSH_INTERVAL_S = 0.25
POLL_WINDOW_S, POLL_MIN_S = 0.0012, 0.0002  # the last 0.2-1.2 ms of a wait is polled (see below)
SWITCH_INTERVAL_S = 0.0002
NAP_S = 30e-6  # one nap while polling: bounds both send lag and the delay in seeing a response
# The last stretch before a due timer is spun on zero-timeout polls: a nap overshoots by tens of
# µs, which showed as send jitter and as a KS distance between sent and scheduled inter-arrivals.
SPIN_S = 60e-6
MAX_BURST = 4  # requests sent without yielding when they are already due


class PreciseSelector(selectors.EpollSelector):
    """epoll waits whole milliseconds, rounded up, so an asyncio timer can fire up to 1 ms late.
    Long waits are cut to whole milliseconds that end 0.2-1.2 ms early; then come zero-timeout
    polls with short naps, and the last ``SPIN_S`` is spun. ``spun_s`` counts the spinning, so the
    CPU figure that marks a worker saturated leaves it out."""

    spun_s = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return super().select(None)
        if timeout >= POLL_WINDOW_S:
            return super().select(math.floor((timeout - POLL_MIN_S) * 1000) / 1000)
        ready = super().select(0)
        if ready or timeout <= 0:
            return ready
        now = time.perf_counter()
        end = now + timeout
        # Nap and poll here rather than return empty-handed: each empty return costs the event loop a pass.
        while end - now > SPIN_S:
            time.sleep(min(end - now - SPIN_S, NAP_S))
            ready = super().select(0)
            if ready:
                return ready
            now = time.perf_counter()
        start = now
        while not ready and now < end:
            ready = super().select(0)
            now = time.perf_counter()
        self.spun_s += now - start
        return ready


def _lower_timer_slack() -> None:
    """Linux pads each sleep by 50 µs of timer slack by default; 1 µs keeps naps short."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK


class Engine:
    def __init__(self, plan: Plan, out: IO[bytes]) -> None:
        self.plan = plan
        self.out = out
        self.cols = empty_columns()
        self.in_flight = 0
        self.sent = self.done = self.dropped = 0
        self.epoch_perf_ns = 0
        self.index, self.t_ns, self.size, self.items = plan.arrays()
        self.bodies: list[Any] = []  # the sender's messages, one per request of the part being sent
        # Open loop: parts of the shard still to come (``plan.more``) arrive as CHUNK frames and
        # wait here; only the part being sent and those queued (SEND_AHEAD_S of the schedule) are held.
        self._parts: collections.deque[tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]] = (
            collections.deque()
        )
        self._more = plan.more
        self._waiting = False  # every request held is sent; the next part has not come yet
        self.sender = make_sender(plan)
        self.selector: PreciseSelector | None = None
        self._next = 0  # open loop: the next request to send
        self._tasks: set[asyncio.Task[None]] = set()
        self._all_sent: asyncio.Future[None] | None = None
        self.stopping = False
        self._cpu_mark = self._run_mark = self._mark()

    def prepare(self) -> None:
        self.bodies = self.build(self.index, self.size, self.items)

    def build(self, index: np.ndarray, size: np.ndarray, items: np.ndarray) -> list[Any]:
        return self.sender.build(index, size, items)

    def add_part(self, data: dict[str, Any], bodies: list[Any] | None = None) -> None:
        """The next part of the shard (a CHUNK frame's data; ``bodies`` built already, or here)."""
        if self.stopping:
            return
        index = np.frombuffer(data["index"], dtype=np.int64)
        t_ns = np.frombuffer(data["t_ns"], dtype=np.int64)
        items = np.frombuffer(data["items"], dtype=np.int32)
        if bodies is None:
            bodies = self.build(index, np.frombuffer(data["size"], dtype=np.int64), items)
        if index.shape[0]:
            self._parts.append((index, t_ns, items, bodies))
        self._more = bool(data.get("more", False))
        if self._waiting:
            self._waiting = False
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self, grace_s: float) -> None:
        """The run was interrupted: send nothing more (the master writes NOT_SENT rows for the
        rest), let the requests in flight finish for ``grace_s``, then cancel them (CANCELLED rows)."""
        if self.stopping:
            return
        self.stopping = True
        self._parts.clear()
        self._next = len(self.index)
        self._more = self._waiting = False
        if self._all_sent is not None and not self._all_sent.done():
            self._all_sent.set_result(None)
        asyncio.get_running_loop().call_later(max(0.0, grace_s), self.sender.cancel)

    def _advance(self) -> bool:
        """Whether a request is left to send, moving on to the next part when this one is spent."""
        if self._next < len(self.index):
            return True
        if not self._parts:
            return False
        self.index, self.t_ns, self.items, self.bodies = self._parts.popleft()
        self._next = 0
        return True

    async def run(self, epoch_unix_ns: int) -> None:
        self.epoch_perf_ns = time.perf_counter_ns() + (epoch_unix_ns - time.time_ns())
        self._cpu_mark = self._run_mark = self._mark()
        await self.sender.open()
        flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        try:
            if self.plan.mode == "closed":
                await self._run_closed()
            else:
                await self._run_open()
        finally:
            flusher.cancel()
            self._flush()
            await self.sender.close()
            done = {"sent": self.sent, "done": self.done, "dropped": self.dropped}
            frames.write_frame(self.out, frames.DONE, {**done, "cpu_ratio": self._ratio(self._run_mark)})

    # -- open loop ----------------------------------------------------------------------
    async def _run_open(self) -> None:
        self._all_sent = asyncio.get_running_loop().create_future()
        self._tick()
        await self._all_sent
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.plan.timeout_s + 5.0)

    def _tick(self, arm: bool = True) -> None:
        try:
            self._send_due(MAX_BURST if arm else 1)
            if arm:
                self._arm()
        except Exception as exc:  # a callback's error would only be logged: end the run with it
            if self._all_sent is not None and not self._all_sent.done():
                self._all_sent.set_exception(exc)

    def _send_due(self, limit: int) -> None:
        """Send what is due, at most ``limit`` requests."""
        loop = asyncio.get_running_loop()
        for _ in range(limit):
            if not self._due():
                break
            j = self._next
            self._next += 1
            if self.in_flight >= self.plan.max_in_flight:
                self.dropped += 1
                self._record(j, None, None, "DROPPED", 0, {})
            else:
                what = (int(self.t_ns[j]), int(self.items[j]), self.sender.size(self.bodies[j]))
                task = loop.create_task(self._complete(*what, *self._start(j)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if (
            not self._advance()
            and not self._more
            and self._all_sent is not None
            and not self._all_sent.done()
        ):
            self._all_sent.set_result(None)

    def _arm(self) -> None:
        """One timer at a time, for the next request; ``_tick`` alone arms it.

        A timer callback rather than a coroutine sleeping per request: ``asyncio.sleep`` costs a
        future, a task step and one more loop pass for every request."""
        if not self._advance():
            self._waiting = self._more  # add_part ticks when the next part comes
            return
        loop = asyncio.get_running_loop()
        left = self.epoch_perf_ns + int(self.t_ns[self._next]) - time.perf_counter_ns()
        if left > 0:
            loop.call_later(left / 1e9, self._tick)
        else:
            loop.call_soon(self._tick)  # behind: yield so responses are read, then go on

    def _due(self) -> bool:
        if not self._advance():
            return False
        j = self._next
        return self.epoch_perf_ns + int(self.t_ns[j]) <= time.perf_counter_ns()

    # -- closed loop ----------------------------------------------------------------------
    async def _run_closed(self) -> None:
        plan = self.plan
        end = self.epoch_perf_ns + plan.duration_ns
        seq = 0
        # Start at the common epoch, as the open loop does: requests sent before it had negative
        # times, overlapped other workers' preparation and were miscounted by the master.
        while (left := self.epoch_perf_ns - time.perf_counter_ns()) > 0:
            await asyncio.sleep(left / 1e9)

        async def user() -> None:
            nonlocal seq
            while time.perf_counter_ns() < end and not self.stopping:
                n, seq = seq, seq + 1
                j = n % max(1, len(self.bodies))
                now = time.perf_counter_ns() - self.epoch_perf_ns
                await self._fire(j, now, index=plan.worker + plan.workers * n)
                if plan.think_ms:
                    await asyncio.sleep(plan.think_ms / 1e3)

        await asyncio.wait_for(
            asyncio.gather(*(user() for _ in range(plan.concurrency))),
            timeout=plan.duration_ns / 1e9 + plan.timeout_s + 5.0,
        )

    # -- one request ------------------------------------------------------------------------
    def _start(self, j: int, index: int | None = None) -> tuple[Any, int, int, int]:
        """Hand request ``j`` to the sender now; returns (pending, sent ns, request index, target)."""
        idx = int(self.index[j]) if index is None else index
        target = idx % len(self.plan.targets)
        self.in_flight += 1
        sent = time.perf_counter_ns() - self.epoch_perf_ns
        return self.sender.start(self.bodies[j], idx, target), sent, idx, target

    async def _complete(
        self, scheduled_ns: int, items: int, req_bytes: int, pending: Any, sent: int, idx: int, target: int
    ) -> None:
        status, resp_bytes, answer = await self.sender.finish(pending)
        done = time.perf_counter_ns() - self.epoch_perf_ns
        self.in_flight -= 1
        self.sent += 1
        self.done += 1
        self._record(-1, sent, done, status, resp_bytes, answer, scheduled_ns, idx, target, items, req_bytes)
        # A request that fell due while a batch's responses were handled goes out now; one at most,
        # since more delay the done times of the responses still waiting (docs/benchmarks.md).
        if self._all_sent is not None and self._due():
            self._tick(arm=False)

    async def _fire(self, j: int, scheduled_ns: int, index: int | None = None) -> None:
        what = (scheduled_ns, int(self.items[j]), self.sender.size(self.bodies[j]) if self.bodies else 0)
        await self._complete(*what, *self._start(j, index))

    def _record(
        self,
        j: int,
        sent: int | None,
        done: int | None,
        status: str,
        resp_bytes: int,
        answer: dict[str, Any],
        scheduled_ns: int | None = None,
        idx: int | None = None,
        target: int | None = None,
        items: int | None = None,
        req_bytes: int | None = None,
    ) -> None:
        """Request ``j`` of the part being sent, or (``j`` = -1) the one described by the rest."""
        c = self.cols
        idx = int(self.index[j]) if idx is None else idx
        sched = int(self.t_ns[j]) if scheduled_ns is None else scheduled_ns
        c["index"].append(idx)
        c["request_id"].append(f"{self.plan.run_id}-{idx}")
        c["worker"].append(self.plan.worker)
        c["target"].append(self.plan.targets[idx % len(self.plan.targets) if target is None else target])
        c["warmup"].append(sched < self.plan.warmup_ns)
        c["scheduled_ns"].append(sched)
        c["sent_ns"].append(sent)
        c["done_ns"].append(done)
        c["status"].append(status)
        c["items"].append(int(self.items[j]) if items is None else items)
        if req_bytes is None:
            req_bytes = self.sender.size(self.bodies[j]) if self.bodies else 0
        c["request_bytes"].append(req_bytes)
        c["response_bytes"].append(resp_bytes)
        for key in ANSWER_COLUMNS:
            c[key].append(answer.get(key))

    # -- CPU and flushing -------------------------------------------------------------------
    def _mark(self) -> tuple[float, float]:
        spun = self.selector.spun_s if self.selector is not None else 0.0
        return time.monotonic(), time.thread_time() - spun

    def _ratio(self, mark: tuple[float, float]) -> float:
        """CPU of the event-loop thread over wall time since ``mark`` (1.0 = one core, saturated).
        Naps sleep and spinning is subtracted, so both count as idle; gRPC's own core threads are
        not counted (an HTTP sender does all its work on this thread)."""
        now = self._mark()
        return (now[1] - mark[1]) / max(1e-9, now[0] - mark[0])

    def _flush(self) -> None:
        if self.cols["index"]:
            cols, self.cols = self.cols, empty_columns()
            cols["_cpu_ratio"] = self._ratio(self._cpu_mark)  # type: ignore[assignment]
            cols["_in_flight"] = self.in_flight  # type: ignore[assignment]
            self._cpu_mark = self._mark()
            frames.write_frame(self.out, frames.RECORDS, cols)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self._flush()


def _read_parts(engine: Engine, loop: asyncio.AbstractEventLoop, inp: IO[bytes]) -> None:
    """The rest of the shard, CHUNK frames on stdin: payloads built here, off the sending thread,
    then handed to the loop. The worker holds our stdin: end of file means it is gone, and so is
    the run."""
    while (frame := frames.read_frame(inp)) is not None:
        kind, data = frame
        if kind == frames.STOP:
            loop.call_soon_threadsafe(engine.stop, float(data.get("grace_s", 0.0)))
        elif kind == frames.CHUNK:
            bodies = engine.build(
                np.frombuffer(data["index"], dtype=np.int64),
                np.frombuffer(data["size"], dtype=np.int64),
                np.frombuffer(data["items"], dtype=np.int32),
            )
            loop.call_soon_threadsafe(engine.add_part, data, bodies)
    os._exit(0)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Frames own the original stdout; anything printed by libraries goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    with contextlib.suppress(OSError):
        fcntl.fcntl(out.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ: a record flush never blocks us
    inp = sys.stdin.buffer
    first = frames.read_frame(inp)
    if first is None or first[0] != frames.PLAN:
        return 2
    try:
        engine = Engine(Plan.from_msg(first[1]), out)
        engine.prepare()
    except Exception as exc:  # tell the master (it prints one line) instead of dying silently
        if not isinstance(exc, (ValueError, OSError)):  # bad input needs no traceback; a bug does
            log.exception("engine failed to prepare")
        frames.write_frame(out, frames.READY, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    frames.write_frame(out, frames.READY, {"requests": len(engine.bodies)})
    go = frames.read_frame(inp)
    if go is None or go[0] != frames.GO:  # STOP before GO: interrupted before the run began
        return 0
    _lower_timer_slack()
    # gRPC's poller thread needs the GIL for every completion: a short switch interval lets it in.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    engine.selector = PreciseSelector()
    loop = asyncio.SelectorEventLoop(engine.selector)
    threading.Thread(target=_read_parts, args=(engine, loop, inp), daemon=True, name="ng-parts").start()
    loop.run_until_complete(engine.run(int(go[1]["epoch_unix_ns"])))
    out.flush()
    # Skip interpreter shutdown: the orphan watcher still blocks reading stdin, and finalizing
    # under it aborts ("could not acquire lock for <stdin>").
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
