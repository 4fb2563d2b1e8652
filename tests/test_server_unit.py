"""Unit tests of the server's parts, in process: batching queue, pipeline, config, telemetry
(the server-timing trailer: test_timing_unit.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netgain.contract.phases import PHASES
from netgain.protos import pb
from netgain.server import eventloop
from netgain.server.batching.pipeline import Pipeline, PipelineConfig
from netgain.server.batching.queue import Pending, QueueClosed, QueueFull, RequestQueue
from netgain.server.coldstart import COLD_START_PHASES, ColdStart
from netgain.server.config import ServeConfig
from netgain.server.device import DeviceOutOfMemory, DeviceRunner
from netgain.server.handlers.base import Handler, InvalidInput
from netgain.server.service import Limits, validate_request
from netgain.server.telemetry.metrics import DURATION_BUCKETS, log_buckets
from netgain.server.telemetry.samplers import thread_role

MS = 1_000_000


def pending(rid: str, items: int = 1, arrival_ns: int = 0, data: bytes = b"x") -> Pending:
    return Pending(rid, [pb.Input(data=data) for _ in range(items)], arrival_ns)


def ids(batch: list[Pending] | None) -> list[str]:
    assert batch is not None
    return [p.request_id for p in batch]


class FakeClock:
    def __init__(self, now_ns: int = 0) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.001)


def blocked_takers(q: RequestQueue) -> int:
    """Threads waiting on the queue's condition (CPython's Condition keeps them in ``_waiters``)."""
    return len(q._cond._waiters)  # type: ignore[attr-defined]


def start_taker(q: RequestQueue, max_items: int, max_delay_ns: int) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(q.take_batch(max_items, max_delay_ns)), daemon=True)
    t.start()
    return t, got


# -- RequestQueue --------------------------------------------------------------------------------
class TestRequestQueue:
    def test_batch_by_size_returns_at_once(self) -> None:
        clock = FakeClock(0)
        q = RequestQueue(16, clock=clock)
        for i in range(5):
            q.put(pending(f"r{i}"))
        # A delay that the fake clock never reaches: only the size can release the batch.
        assert ids(q.take_batch(3, max_delay_ns=10**15)) == ["r0", "r1", "r2"]
        assert len(q) == 2

    def test_batch_by_delay_counts_from_first_arrival(self) -> None:
        clock = FakeClock(10 * MS)
        q = RequestQueue(16, clock=clock)
        q.put(pending("first", arrival_ns=0))
        q.put(pending("second", arrival_ns=9 * MS))
        # Deadline = first arrival (0) + 10 ms = now: released, though "second" waited only 1 ms.
        assert ids(q.take_batch(8, max_delay_ns=10 * MS)) == ["first", "second"]

    def test_delay_waits_for_companions_until_first_deadline(self) -> None:
        clock = FakeClock(0)
        q = RequestQueue(16, clock=clock)
        q.put(pending("first", arrival_ns=0))
        t, got = start_taker(q, 8, max_delay_ns=20 * MS)
        clock.now_ns = 5 * MS
        q.put(pending("late", arrival_ns=5 * MS))
        wait_until(lambda: blocked_takers(q) == 1, "the taker to wait")
        assert t.is_alive()  # the fake clock is before the first deadline: nothing can be released
        # First arrival + 20 ms: released, though the late request's own deadline (25 ms) never comes.
        clock.now_ns = 20 * MS
        t.join(10.0)  # generous: the taker re-reads the clock within its 20 ms (real) timed wait
        assert not t.is_alive() and ids(got[0]) == ["first", "late"]

    def test_old_first_request_shortens_the_wait(self) -> None:
        clock = FakeClock(80 * MS)
        q = RequestQueue(16, clock=clock)
        q.put(pending("old", arrival_ns=0))
        t, got = start_taker(q, 8, max_delay_ns=100 * MS)
        wait_until(lambda: blocked_takers(q) == 1, "the taker to wait")
        assert t.is_alive()
        # 100 ms after its arrival, 20 ms after take_batch was called: counted from arrival.
        clock.now_ns = 100 * MS
        t.join(10.0)  # generous: the taker re-reads the clock within its 20 ms (real) timed wait
        assert not t.is_alive() and ids(got[0]) == ["old"]

    def test_wakes_when_a_request_arrives(self) -> None:
        q = RequestQueue(4)
        t, got = start_taker(q, 1, 0)
        wait_until(lambda: blocked_takers(q) == 1, "the taker to block on the empty queue")
        assert t.is_alive()
        q.put(pending("a", arrival_ns=time.perf_counter_ns()))
        t.join(10.0)  # generous: only a missed wake-up (an untimed wait) would make it time out
        assert not t.is_alive() and ids(got[0]) == ["a"]

    def test_full_queue_sheds_at_once(self) -> None:
        q = RequestQueue(2)
        q.put(pending("a"))
        q.put(pending("b"))
        # Nothing takes from this queue: a put that waited for room would never return, so raising
        # at all shows it did not wait.
        with pytest.raises(QueueFull, match=r"full \(2 requests waiting\)"):
            q.put(pending("c"))
        assert len(q) == 2
        q.take_batch(1, 0)
        q.put(pending("d"))  # room again
        assert len(q) == 2

    def test_close_refuses_new_drains_queued_then_none(self) -> None:
        q = RequestQueue(8, clock=FakeClock(0))
        q.put(pending("a"))
        q.put(pending("b"))
        q.close()
        with pytest.raises(QueueClosed, match="shutting down"):
            q.put(pending("c"))
        # Closed: queued requests come out without waiting for the delay.
        assert ids(q.take_batch(8, max_delay_ns=10**15)) == ["a", "b"]
        assert q.take_batch(8, 0) is None

    def test_close_wakes_a_waiting_taker(self) -> None:
        q = RequestQueue(8)
        t, got = start_taker(q, 4, 0)
        wait_until(lambda: blocked_takers(q) == 1, "the taker to block on the empty queue")
        q.close()
        t.join(10.0)  # generous: only a missed wake-up (an untimed wait) would make it time out
        assert not t.is_alive() and got == [None]

    def test_order_preserved_across_batches(self) -> None:
        q = RequestQueue(64, clock=FakeClock(0))
        for i in range(10):
            q.put(pending(f"r{i}"))
        q.close()
        seen: list[str] = []
        while (batch := q.take_batch(3, 10**15)) is not None:
            assert len(batch) <= 3
            seen += ids(batch)
        assert seen == [f"r{i}" for i in range(10)]

    def test_counts_items_not_requests(self) -> None:
        q = RequestQueue(8, clock=FakeClock(0))
        for rid, n in (("a", 2), ("b", 2), ("c", 1)):
            q.put(pending(rid, items=n))
        assert ids(q.take_batch(4, 10**15)) == ["a", "b"]

    def test_oversized_request_forms_its_own_batch(self) -> None:
        q = RequestQueue(8, clock=FakeClock(0))
        q.put(pending("small", items=1))
        q.put(pending("big", items=6))
        q.put(pending("tail", items=1))
        # "small" + "big" reach the size, but "big" does not fit beside "small".
        assert ids(q.take_batch(4, 10**15)) == ["small"]
        assert ids(q.take_batch(4, 10**15)) == ["big"]
        q.close()
        assert ids(q.take_batch(4, 10**15)) == ["tail"]

    def test_rejects_zero_capacity(self) -> None:
        with pytest.raises(ValueError, match="at least 1"):
            RequestQueue(0)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(1, 6), min_size=1, max_size=30), st.integers(1, 8))
    def test_batches_partition_in_order(self, sizes: list[int], max_items: int) -> None:
        q = RequestQueue(64, clock=FakeClock(0))
        for i, n in enumerate(sizes):
            q.put(pending(f"r{i}", items=n))
        q.close()
        seen: list[str] = []
        while (batch := q.take_batch(max_items, 10**15)) is not None:
            total = sum(p.n_items for p in batch)
            assert total <= max_items or len(batch) == 1
            seen += ids(batch)
        assert seen == [f"r{i}" for i in range(len(sizes))]


# -- Pipeline -----------------------------------------------------------------------------------------
class RecordingHandler(Handler):
    """Payload ``b"bad"`` is invalid; ``b"boom"`` makes the forward pass raise; label = payload length."""

    name = "recording"
    uses_device = False

    def __init__(self, forward_error: Exception | None = None) -> None:
        super().__init__()
        self.preprocessed: list[bytes] = []
        self.forward_error = forward_error

    def build_model(self) -> Any:
        return None

    def preprocess(self, item: pb.Input) -> Any:
        self.preprocessed.append(item.data)
        if item.data == b"bad":
            raise InvalidInput("payload is bad on purpose")
        return item.data

    def collate(self, items: list[Any]) -> Any:
        return list(items)

    def forward(self, model: Any, batch: Any) -> Any:
        if b"boom" in batch:
            raise RuntimeError("kaboom")
        if self.forward_error is not None:
            raise self.forward_error
        return [len(x) for x in batch]

    def postprocess(self, row: Any) -> pb.Output:
        return pb.Output(label=int(row))


class Collector:
    def __init__(self) -> None:
        self.done: list[Pending] = []
        self.cond = threading.Condition()

    def __call__(self, reqs: list[Pending]) -> None:
        with self.cond:
            self.done.extend(reqs)
            self.cond.notify_all()

    def wait_for(self, n: int, timeout_s: float = 5.0) -> dict[str, Pending]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.done) >= n, timeout_s), f"only {len(self.done)} of {n}"
        return {p.request_id: p for p in self.done}


def make_pipeline(
    handler: Handler, max_batch: int = 8, delay_ms: float = 30.0, queue_size: int = 64
) -> tuple[Pipeline, RequestQueue, Collector]:
    q = RequestQueue(queue_size)
    collector = Collector()
    runner = DeviceRunner(handler, "cpu")
    runner.place(handler.build_model())
    pipe = Pipeline(handler, [runner], q, PipelineConfig(max_batch, delay_ms, 2), collector)
    return pipe, q, collector


def put_all(q: RequestQueue, payloads: dict[str, bytes], deadline_ns: dict[str, int] | None = None) -> None:
    now = time.perf_counter_ns()
    for rid, data in payloads.items():
        p = pending(rid, arrival_ns=now, data=data)
        if deadline_ns and rid in deadline_ns:
            p.deadline_ns = deadline_ns[rid]
        q.put(p)


class TestPipeline:
    def test_bad_payload_fails_only_its_request(self) -> None:
        handler = RecordingHandler()
        pipe, q, out = make_pipeline(handler)
        put_all(q, {"a": b"aaaa", "bad": b"bad", "c": b"cc"})
        pipe.start()
        try:
            done = out.wait_for(3)
        finally:
            pipe.stop(5.0)
        assert done["bad"].code == "INVALID_ARGUMENT"
        assert "bad on purpose" in done["bad"].message
        assert done["bad"].outputs == []
        assert (done["a"].code, done["c"].code) == ("OK", "OK")
        # Outputs map back to their own request (rows not shifted by the failed one).
        assert [o.label for o in done["a"].outputs] == [4]
        assert [o.label for o in done["c"].outputs] == [2]
        # One batch: same id for all; size counts the items that reached the device.
        assert len({p.batch_id for p in done.values()}) == 1
        assert done["a"].batch_size == done["c"].batch_size == 2
        for p in done.values():
            assert set(PHASES) - {"post"} <= set(p.spans)
            assert all(v >= 0 for v in p.spans.values())

    def test_expired_request_dropped_before_compute(self) -> None:
        handler = RecordingHandler()
        pipe, q, out = make_pipeline(handler, delay_ms=20.0)
        put_all(q, {"late": b"late-payload", "ok": b"ok"}, deadline_ns={"late": 1})
        pipe.start()
        try:
            done = out.wait_for(2)
        finally:
            pipe.stop(5.0)
        assert done["late"].code == "DEADLINE_EXCEEDED"
        assert "before compute" in done["late"].message
        assert done["late"].batch_id == -1
        assert b"late-payload" not in handler.preprocessed  # never pre-processed
        assert done["ok"].code == "OK" and done["ok"].batch_id >= 1

    def test_forward_error_fails_batch_and_pipeline_keeps_serving(self) -> None:
        handler = RecordingHandler()
        pipe, q, out = make_pipeline(handler, max_batch=2, delay_ms=5.0)
        put_all(q, {"x": b"boom", "y": b"y"})
        pipe.start()
        try:
            out.wait_for(2)
            put_all(q, {"after": b"fine"})
            done = out.wait_for(3)
        finally:
            pipe.stop(5.0)
        assert done["x"].code == done["y"].code == "INTERNAL"
        assert "kaboom" in done["x"].message
        assert done["after"].code == "OK" and done["after"].outputs[0].label == 4

    def test_device_oom_is_resource_exhausted(self) -> None:
        handler = RecordingHandler(forward_error=DeviceOutOfMemory("device out of memory on a single item"))
        pipe, q, out = make_pipeline(handler)
        put_all(q, {"a": b"a"})
        pipe.start()
        try:
            done = out.wait_for(1)
        finally:
            pipe.stop(5.0)
        assert done["a"].code == "RESOURCE_EXHAUSTED"
        assert "retry with fewer items" in done["a"].message

    def test_batches_in_arrival_order_and_stop_drains(self) -> None:
        handler = RecordingHandler()
        pipe, q, out = make_pipeline(handler, max_batch=2, delay_ms=1000.0)
        put_all(q, {f"r{i}": b"x" * (i + 1) for i in range(5)})
        pipe.start()
        pipe.stop(5.0)  # closes the queue: the last, partial batch leaves without its 1 s delay
        # stop has returned, so all five were delivered; the timeout only bounds a failure.
        done = out.wait_for(5, timeout_s=5.0)
        order = sorted(done.values(), key=lambda p: p.batch_id)
        assert [p.request_id for p in order] == [f"r{i}" for i in range(5)]
        assert [p.batch_size for p in order] == [2, 2, 2, 2, 1]
        assert all(p.code == "OK" and p.outputs[0].label == int(p.request_id[1:]) + 1 for p in order)


# -- device runner ---------------------------------------------------------------------------------------
class OomUnlessSmall(Handler):
    """Raises torch's OutOfMemoryError for batches above ``fits`` rows."""

    name = "oom"

    def __init__(self, fits: int) -> None:
        super().__init__()
        self.fits = fits

    def forward(self, model: Any, batch: Any) -> Any:
        import torch

        if batch.shape[0] > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return batch * 2


def test_device_runner_splits_a_batch_after_oom() -> None:
    import torch

    runner = DeviceRunner(OomUnlessSmall(fits=2), "cpu")
    runner.place(torch.nn.Identity())
    batch = torch.arange(8, dtype=torch.float32).view(8, 1)
    result = runner.run(batch)
    assert torch.equal(result.output, batch * 2)
    assert result.splits == 3  # 8 → 4+4 → 2+2+2+2
    with pytest.raises(DeviceOutOfMemory, match="single item"):
        DeviceRunner(OomUnlessSmall(fits=0), "cpu").run(batch[:1])


# -- validation and configuration --------------------------------------------------------------------------
def test_validate_request() -> None:
    limits = Limits(max_items=2, max_message_bytes=1 << 20)
    one = pb.Input(data=b"x")
    assert validate_request(pb.InferRequest(inputs=[one]), "image", limits) is None
    assert validate_request(pb.InferRequest(model="image", inputs=[one]), "image", limits) is None
    cases = [
        (pb.InferRequest(model="text", inputs=[one]), "NOT_FOUND", "'text' is not served here"),
        (pb.InferRequest(), "INVALID_ARGUMENT", "no inputs"),
        (pb.InferRequest(inputs=[one, one, one]), "INVALID_ARGUMENT", "3 inputs, over the limit of 2"),
        (pb.InferRequest(inputs=[one, pb.Input()]), "INVALID_ARGUMENT", "input 1 is empty"),
    ]
    for request, code, message in cases:
        result = validate_request(request, "image", limits)
        assert result is not None
        assert result[0].name == code and message in result[1]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_batch_size", 0, "--max-batch-size must be at least 1"),
        ("max_queue_delay_ms", -1.0, "--max-queue-delay-ms must be >= 0"),
        ("max_queue_size", 0, "--max-queue-size must be at least 1"),
        ("instances", 0, "--instances must be at least 1"),
        ("pre_threads", 0, "--pre-threads must be at least 1"),
        ("intra_op_threads", -1, "--intra-op-threads must be >= 0"),
        ("max_message_bytes", 10, "--max-message-mb must be at least 0.001 (1 KiB)"),
        ("max_items_per_request", 0, "--max-items-per-request must be at least 1"),
        ("port", 70000, "--port must be in 0..65535"),
        ("metrics_port", -2, "--metrics-port must be in -1..65535"),
        ("http_port", -2, "--http-port must be in -1..65535"),
        ("http_port", 50051, "--http-port 50051 is taken by --port"),
        ("http_port", 9464, "--http-port 9464 is taken by --port or --metrics-port"),
        ("tls_cert", "cert.pem", "--tls-cert and --tls-key go together"),
        ("tls_client_ca", "ca.pem", "--tls-client-ca needs --tls-cert"),
        ("sample_interval_s", 0.0, "--sample-interval-s must be > 0"),
        ("recorder_interval_s", 0.0, "--recorder-interval-s must be > 0"),
    ],
)
def test_serve_config_validate_messages(field: str, value: Any, message: str) -> None:
    ServeConfig().validate()  # defaults are valid
    cfg = ServeConfig(**{field: value})
    with pytest.raises(ValueError) as err:
        cfg.validate()
    assert message in str(err.value)


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eventloop.loop_factory("asyncio") == ("asyncio", None)
    with pytest.raises(ValueError, match="--event-loop 'tokio': use one of auto, asyncio, uvloop"):
        eventloop.loop_factory("tokio")
    with pytest.raises(ValueError, match="--event-loop 'tokio'"):
        ServeConfig(event_loop="tokio").validate()
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        assert eventloop.loop_factory("auto") == ("uvloop", uvloop.new_event_loop)
        assert eventloop.run(_loop_name(), "auto") == "uvloop"
        assert eventloop.describe("auto") == f"uvloop {uvloop.__version__}"
    assert eventloop.run(_loop_name(), "asyncio") == "asyncio"
    assert eventloop.describe("asyncio") == "asyncio"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: its import fails
    assert eventloop.loop_factory("auto") == ("asyncio", None)
    with pytest.raises(ValueError, match="--event-loop uvloop: uvloop is not installed"):
        ServeConfig(event_loop="uvloop").validate()


async def _loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_cold_start_timeline() -> None:
    cold = ColdStart(created_unix_s=1000.0)
    cold.mark("process_start", 1000.5)
    cold.mark("imports", 1002.0)
    cold.mark("ready", 1003.0)
    assert cold.timeline() == [("process_start", 0.5, 0.5), ("imports", 2.0, 1.5), ("ready", 3.0, 1.0)]
    assert COLD_START_PHASES[0] == "process_start" and COLD_START_PHASES[-1] == "ready"
    with pytest.raises(ValueError, match="unknown cold-start phase"):
        cold.mark("lunch")


# -- telemetry helpers ---------------------------------------------------------------------------------------
def test_duration_buckets_span_10us_to_10s_log_spaced() -> None:
    assert DURATION_BUCKETS[0] == pytest.approx(1e-5)
    assert DURATION_BUCKETS[-1] == pytest.approx(10.0)
    ratios = [b / a for a, b in itertools.pairwise(DURATION_BUCKETS)]
    assert all(1.6 < r < 1.9 for r in ratios)  # 4 per decade
    assert log_buckets(1e-3, 1.0, per_decade=1) == (0.001, 0.01, 0.1, 1.0)


def test_thread_roles() -> None:
    assert thread_role("python", 10, 10) == "frontend"
    assert thread_role("netgain-prepost_0", 11, 10) == "prepost"
    assert thread_role("netgain-device-0", 12, 10) == "device"
    assert thread_role("netgain-batcher", 13, 10) == "batcher"
    assert thread_role("grpc_global_tim", 14, 10) == "grpc"
    assert thread_role("", 15, 10) == "compute"


def test_example_inputs_are_deterministic() -> None:
    from netgain.server.handlers.tabular import TabularHandler

    h = TabularHandler()
    assert h.example_input(random.Random(3)) == h.example_input(random.Random(3))


def test_duration_histograms_batch_shared_phases_equal_per_request_observations() -> None:
    """Per-request series plus a batch's shared phases once with a count export exactly what
    every value of every request observed one by one does (counts, sums, bucket edges)."""
    import numpy as np
    from prometheus_client import CollectorRegistry

    from netgain.server.telemetry.histograms import ALL, PER_REQUEST, SERIES, SHARED, DurationHistograms

    rng = np.random.default_rng(7)
    bounds = list(DURATION_BUCKETS)
    split, whole = DurationHistograms({"model": "m"}, bounds), DurationHistograms({"model": "m"}, bounds)
    for batch in range(20):
        n = int(rng.integers(1, 33))
        rows = rng.lognormal(np.log(2e-3), 2.0, size=(n, len(SERIES)))
        shared = rows[0, list(SHARED)].copy()
        shared[batch % len(shared)] = bounds[batch % len(bounds)]  # a value on a bucket edge
        rows[:, list(SHARED)] = shared  # a batch shares these phases
        ids = [f"b{batch}-{i}" for i in range(n)]
        split.add(rows[:, list(PER_REQUEST)], ids, PER_REQUEST)
        split.add_repeated(SHARED, shared.tolist(), n)
        whole.add(rows, ids, ALL)
    got, want = CollectorRegistry(), CollectorRegistry()
    got.register(split)
    want.register(whole)
    samples = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value for f in got.collect() for smp in f.samples
    }
    expected = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value for f in want.collect() for smp in f.samples
    }
    assert samples.keys() == expected.keys()
    for key, value in expected.items():
        assert samples[key] == pytest.approx(value, rel=1e-12), key


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from netgain.server.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="--device cuda: CUDA is not available on this host"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="use cpu, cuda, cuda:N or auto"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="use cpu, cuda, cuda:N or auto"):
        resolve_device("cudax")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    for bad in ("cuda:2", "cuda:x", "cuda:-1"):
        with pytest.raises(ValueError, match=r"no such GPU, this host has 2 \(cuda:0..cuda:1\)"):
            resolve_device(bad)
