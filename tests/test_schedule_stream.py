"""The streamed schedule: the same requests as the eager one, and memory bounded by a
window however long the schedule, in the master (Dealer) and in a sender engine."""

from __future__ import annotations

import asyncio
import io
import math
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

from netgain.contract.messages import Plan
from netgain.loadgen import stream
from netgain.loadgen.runner.plans import SEND_AHEAD_S, Dealer, shard_arrays
from netgain.loadgen.schedule import from_trace
from netgain.loadgen.traces import Trace, rescale, synthesize

CASES = [
    ("constant", 300.0, 7.3, {}),
    ("poisson", 3000.0, 30.0, {}),  # 90,000 requests: more than one replayed block
    ("gamma", 3000.0, 30.0, {"cv": 3.0}),
    ("gamma", 50.0, 3.0, {"cv": 0.5}),
    ("onoff", 600.0, 25.0, {"on_s": 1.5, "off_s": 2.0}),
    ("diurnal", 500.0, 20.0, {"period_s": 7.0, "amplitude": 0.8}),
    ("poisson", 300.0, 10.0, {"size_bytes": 48000, "size_sigma": 0.7, "items": "1:0.7,4:0.2,16:0.1"}),
]


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(("arrival", "rate", "seconds", "kw"), CASES, ids=[f"{c[0]}-{c[1]:g}" for c in CASES])
def test_streamed_schedule_is_the_eager_one(
    seed: int, arrival: str, rate: float, seconds: float, kw: Any
) -> None:
    eager = from_trace(synthesize(arrival, rate, seconds, seed, **kw), warmup_s=1.0)
    # A small window: the sorted draws are replayed and collected in many windows.
    lazy = stream.synthesize(arrival, rate, seconds, seed, warmup_s=1.0, window=1000, **kw)
    chunks = list(lazy.chunks(777))
    assert all(len(c) == 777 for c in chunks[:-1])
    for name in ("index", "t_ns", "size", "items"):
        got = np.concatenate([getattr(c, name) for c in chunks])
        assert np.array_equal(got, getattr(eager, name)), name
        assert got.dtype == getattr(eager, name).dtype
    assert (len(lazy), lazy.digest, lazy.source) == (len(eager), eager.digest, eager.source)
    assert lazy.duration_s == eager.duration_s and lazy.warmup_ns == eager.warmup_ns


def test_streamed_trace_is_the_eager_one() -> None:
    trace = synthesize("gamma", 500.0, 10.0, seed=2, items="1:0.5,4:0.5")
    eager, lazy = from_trace(trace, 2.0), stream.from_trace(trace, 2.0)
    chunks = list(lazy.chunks(1000))
    assert np.array_equal(np.concatenate([c.t_ns for c in chunks]), eager.t_ns)
    assert np.array_equal(np.concatenate([c.items for c in chunks]), eager.items)
    assert lazy.digest == eager.digest and len(lazy) == len(eager)


def test_dealer_shards_every_request_once_and_fills_what_never_came() -> None:
    sched = stream.synthesize("poisson", 2000.0, 10.0, seed=4)
    dealer = Dealer(sched, workers=3, chunk=1000)
    first = dealer.take(int(SEND_AHEAD_S * 1e9), at_least_one=True)
    assert first and all(int(c.t_ns[0]) <= SEND_AHEAD_S * 1e9 for c in first) and dealer.more
    got = [np.frombuffer(shard_arrays(first, w, 3)["index"], dtype=np.int64) for w in range(3)]
    assert sorted(np.concatenate(got).tolist()) == list(range(dealer.dealt))
    assert all((g % 3 == w).all() for w, g in enumerate(got))
    dealer.mark(np.arange(dealer.dealt))  # every row of what was dealt came back
    dealer.mark(np.array([0, 1]))  # and two twice
    assert list(dealer.retire({}, run_id="r", targets=["t"])) == [] and dealer.base == dealer.dealt
    assert dealer.duplicates == 2
    dealer.take(int(7e9))
    idx = np.arange(dealer.base, dealer.dealt)
    dealer.mark(idx[idx % 3 != 1])  # worker 1 is lost at 6 s: the chunk retires with its rows made
    fills = list(dealer.retire({1: 6.0}, run_id="r", targets=["t"]))
    rows = [s for f in fills for s in f["status"]]
    assert len(rows) == int((idx % 3 == 1).sum()) and {"WORKER_LOST", "NOT_SENT"} >= set(rows)
    # The end: nothing more came; every request not yet dealt gets its NOT_SENT row too.
    rest = list(dealer.retire({1: 6.0}, run_id="r", targets=["t"], final=True))
    assert dealer.base == dealer.dealt == len(sched) and not dealer.more
    assert dealer.not_sent + dealer.worker_lost == len(rows) + sum(len(f["status"]) for f in rest)


def _master_peak(seconds: float, rate: float) -> tuple[int, int]:
    """Peak traced bytes of the master's side of a run of ``seconds`` at ``rate`` (4 workers):
    the schedule streamed, dealt SEND_AHEAD_S ahead on a fake clock advanced 0.25 s a step,
    every request answered 1 s after its time (a fake server), and dealt chunks retired."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    sched = stream.synthesize("poisson", rate, seconds, seed=1, window=1 << 15, items="1:0.5,4:0.5")
    dealer = Dealer(sched, workers=4)
    now_ns, answered = 0, 0
    while dealer.more or dealer.pending:
        for c in dealer.take(now_ns + int(SEND_AHEAD_S * 1e9), at_least_one=now_ns == 0):
            for w in range(4):
                shard_arrays([c], w, 4)  # what is sent to each worker
        upto = np.searchsorted(
            np.concatenate([c.t_ns for c, _ in dealer.pending]) if dealer.pending else np.zeros(0, np.int64),
            now_ns - 1_000_000_000,
            side="right",
        )
        dealer.mark(np.arange(answered, max(answered, dealer.base + int(upto))))
        answered = max(answered, dealer.base + int(upto))
        for _ in dealer.retire({}, run_id="r", targets=["t"]):
            raise AssertionError("nothing is missing")
        now_ns += 250_000_000
    assert dealer.base == len(sched) and dealer.duplicates == 0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, len(sched)


@pytest.mark.slow
def test_master_memory_does_not_grow_with_the_schedule() -> None:
    # 2,000 req/s for 10 s, 100 s and 1,000 s (2 M requests): the eager schedule was ~38 B a
    # request (76 MB at 2 M); streamed, the peak is a window and stays the same.
    peaks = {s: _master_peak(s, 2000.0) for s in (10.0, 100.0, 1000.0)}
    print({s: (round(p / 1e6, 2), n) for s, (p, n) in peaks.items()})
    # 10 s (20,000 requests) is under one window of sorted draws (32,768): made in one draw;
    # from 100 s on the window is full and the peak flat (measured 1.5, 3.7, 3.9 MB).
    (p1, _), (p10, _), (p100, n100) = peaks[10.0], peaks[100.0], peaks[1000.0]
    assert p100 < 1.3 * p10 + 500_000  # 10x more requests, about the same peak
    assert p100 < 5 * p1  # 100x more requests: not 100x the memory
    assert p100 < 38 * n100 / 10  # under a tenth of the eager schedule (38 B a request)


class _Null(io.RawIOBase):
    def write(self, b: Any) -> int:
        return len(b)


class _Answered:
    """A gRPC call answered at once."""

    def __await__(self) -> Any:
        if False:
            yield
        return b"ok"

    async def trailing_metadata(self) -> tuple[()]:
        return ()


def _constant_parts(rate: float, seconds: float, chunk: int = 1024) -> Any:
    """The ``constant`` schedule's parts as the master deals them to one worker (CHUNK data),
    made one at a time from the index: the master's own buffers (the streamed schedule's blocks
    of 65,536 requests, covered by the test above) stay out of the engine's peak."""
    n = math.ceil(rate * seconds)
    for start in range(0, n, chunk):
        index = np.arange(start, min(n, start + chunk), dtype=np.int64)
        yield {
            "index": index.tobytes(),
            "t_ns": np.round(index / rate * 1e9).astype(np.int64).tobytes(),
            "size": np.zeros(index.shape[0], np.int64).tobytes(),
            "items": np.ones(index.shape[0], np.int32).tobytes(),
            "more": start + chunk < n,
        }


def _engine_peak(seconds: float, rate: float) -> tuple[int, int]:
    """Peak traced bytes of one sender engine sending ``seconds`` of a ``rate`` schedule, dealt to
    it as the master does (a part per chunk, a horizon ahead), against calls answered at once."""
    from netgain.loadgen.runner.engine import Engine

    n = math.ceil(rate * seconds)
    tracemalloc.start()
    tracemalloc.reset_peak()
    parts = _constant_parts(rate, seconds)
    first = next(parts)
    ahead = int(0.2e9)  # compressed: the run is ~100x faster than a real one; so is its horizon
    plan = Plan(
        run_id="r", worker=0, workers=1, targets=["127.0.0.1:1"], model="null", handler_options={},
        seed=0, mode="open", warmup_ns=0, timeout_s=1.0, max_in_flight=100_000, more=first["more"],
        **{k: v for k, v in first.items() if k != "more"},
    )  # fmt: skip
    engine = Engine(plan, _Null())  # type: ignore[arg-type]
    engine.prepare()
    engine.sender.calls = [[lambda body, metadata, timeout: _Answered()]]
    queued: dict[str, Any] | None = next(parts, None)

    async def deal() -> None:
        nonlocal queued
        while queued is not None:
            await asyncio.sleep(0.02)
            now = time.perf_counter_ns() - engine.epoch_perf_ns
            while queued is not None and int(np.frombuffer(queued["t_ns"], np.int64)[0]) <= now + ahead:
                engine.add_part(queued)
                queued = next(parts, None)

    async def main() -> None:
        engine.epoch_perf_ns = time.perf_counter_ns() + 20_000_000
        dealing = asyncio.get_running_loop().create_task(deal())
        flushing = asyncio.get_running_loop().create_task(engine._flush_loop())
        await asyncio.wait_for(engine._run_open(), seconds + 30.0)
        dealing.cancel()
        flushing.cancel()
        engine._flush()

    asyncio.run(main())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert engine.sent + engine.dropped == n and engine.dropped == 0
    return peak, n


@pytest.mark.slow
def test_engine_memory_does_not_grow_with_the_schedule() -> None:
    # 5,000 req/s for 0.5, 5 and 50 s: 2,500 to 250,000 requests sent by one engine. It holds the
    # part being sent, the parts queued (a horizon ahead), the tasks in flight and the records of
    # one flush (0.25 s): nothing per request of the run. Measured 0.88, 0.97 and 1.05 MB; the
    # 0.9 / 1.7 / 5.6 MB measured before counted the test's own dealer, whose streamed schedule
    # holds blocks of up to 65,536 requests (the master's memory, bounded by the test above).
    peaks = {s: _engine_peak(s, 5000.0) for s in (0.5, 5.0, 50.0)}
    print({s: (round(p / 1e6, 2), n) for s, (p, n) in peaks.items()})
    # Bytes added per extra request: keeping any column of the schedule (8 bytes of t_ns alone, ~22
    # for a row) would cross 8; a loaded host's lag adds less (3 measured in a fresh venv on 2 cores).
    for short in (0.5, 5.0):
        grown = (peaks[50.0][0] - peaks[short][0]) / (peaks[50.0][1] - peaks[short][1])
        assert grown < 8.0, (short, grown)


@pytest.mark.parametrize(
    ("rate", "duration_s"),
    [(None, 95.0), (None, 10.0), (None, 25.0), (300.0, 40.0), (50.0, 7.0), (2000.0, 3.0)],
)
def test_looped_trace_streamed_is_the_eager_loop(rate: float | None, duration_s: float) -> None:
    # A 12 s recording starting late (0.5 s), gamma arrivals: looped lazily, copy by copy, it is
    # the same schedule as rescale's eager np.tile (cut and no-loop cases delegate to it).
    raw = synthesize("gamma", 80.0, 12.0, seed=3, items="1:0.5,4:0.5", size_bytes=5000, size_sigma=0.5)
    trace = Trace(raw.t_s + 0.5, raw.size, raw.items, source="rec.csv")
    eager = from_trace(rescale(trace, rate=rate, duration_s=duration_s), 1.0)
    lazy = stream.rescaled(trace, 1.0, rate=rate, duration_s=duration_s)
    chunks = list(lazy.chunks(500))
    for name in ("index", "t_ns", "size", "items"):
        got = np.concatenate([getattr(c, name) for c in chunks])
        assert np.array_equal(got, getattr(eager, name)), name
        assert got.dtype == getattr(eager, name).dtype
    assert (len(lazy), lazy.digest, lazy.source) == (len(eager), eager.digest, eager.source)
    assert lazy.duration_s == eager.duration_s


def _loop_peak(loops: int) -> tuple[int, int]:
    """Peak traced bytes of streaming a 10 s trace (20,000 requests) looped ``loops`` times."""
    trace = synthesize("poisson", 2000.0, 10.0, seed=5)
    tracemalloc.start()
    tracemalloc.reset_peak()
    sched = stream.rescaled(trace, 0.0, duration_s=10.0 * loops)
    n = sum(len(c) for c in sched.chunks())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == len(sched) > (loops - 1) * len(trace)
    return peak, n


def test_looped_trace_memory_does_not_grow_with_the_loops() -> None:
    # 10 and 100 loops (200 k and 2 M requests): the eager loop held ~20 B a request (40 MB at
    # 2 M, tiled); streamed, a block of the trace at a time.
    (p10, _), (p100, n100) = _loop_peak(10), _loop_peak(100)
    print({"10 loops": round(p10 / 1e6, 2), "100 loops": round(p100 / 1e6, 2)})
    assert p100 < 1.5 * p10 and p100 < 20 * n100 / 10
