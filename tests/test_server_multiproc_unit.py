"""The --workers server's parts in one process: the /metrics merge over processes, the shared slot
ring and its records, and how records are cut into pipe writes and put together on the reading side."""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netgain.server.batching.queue import Pending
from netgain.server.config import ServeConfig
from netgain.server.handlers.base import Handler
from netgain.server.multiproc.device_proc import DevicePipes, DeviceProcess, atomic_chunks
from netgain.server.multiproc.frontend import Handoff
from netgain.server.multiproc.metrics_merge import (
    MergedCollector,
    families_from_json,
    families_json,
    merge,
    scrape,
    serve_families,
)
from netgain.server.multiproc.slots import (
    _ITEM,
    HANDED,
    INPUT,
    ITEM_HEADER,
    MAX_ITEMS_PER_RECORD,
    MAX_MESSAGE,
    NEXT,
    QUEUED,
    REPLY,
    REQUEST,
    SEQ,
    TAKER,
    Ring,
    SlotTooSmall,
    encode_reply,
    encode_request,
)
from netgain.server.telemetry.metrics import ServerMetrics

# -- the metrics merge -------------------------------------------------------------------------------


def _process(requests: float, cores: int, start_s: float, latency_s: list[float]) -> CollectorRegistry:
    """One process's registry: a counter, two gauges that are not sums, a histogram and an info."""
    reg = CollectorRegistry()
    Counter("netgain_requests", "requests", ["model"], registry=reg).labels("m").inc(requests)
    Gauge("netgain_cpu_cores", "cores", registry=reg).set(cores)
    Gauge("process_start_time_seconds", "start", registry=reg).set(start_s)
    Gauge("netgain_queue_depth", "queued", registry=reg).set(requests / 10)
    h = Histogram("netgain_latency_seconds", "latency", buckets=(0.01, 0.1, 1.0), registry=reg)
    for v in latency_s:
        h.observe(v)
    Info("netgain_server", "info", registry=reg).info({"dtype": "float32"})
    return reg


def _values(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_merge_sums_counters_gauges_and_buckets_and_keeps_the_non_sums() -> None:
    a = _process(30, 4, 1000.0, [0.005, 0.05])
    b = _process(12, 4, 990.0, [0.5, 0.5, 2.0])
    got = _values(merge([a.collect(), b.collect()]))
    assert got[("netgain_requests_total", (("model", "m"),))] == 42
    assert got[("netgain_queue_depth", ())] == pytest.approx(4.2)
    assert got[("netgain_cpu_cores", ())] == 4  # the same cores in every process: not 8
    assert got[("process_start_time_seconds", ())] == 990.0  # the server started with its first process
    bucket = {
        le: got[("netgain_latency_seconds_bucket", (("le", le),))] for le in ("0.01", "0.1", "1.0", "+Inf")
    }
    assert bucket == {"0.01": 1, "0.1": 2, "1.0": 4, "+Inf": 5}
    assert got[("netgain_latency_seconds_count", ())] == 5
    assert got[("netgain_latency_seconds_sum", ())] == pytest.approx(3.055)
    key = ("netgain_requests_created", (("model", "m"),))
    assert got[key] == min(_values(list(r.collect()))[key] for r in (a, b))  # the earliest
    assert got[("netgain_server_info", (("dtype", "float32"),))] == 1


def test_merge_keeps_label_sets_apart_and_a_family_seen_once() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    Counter("netgain_x", "x", ["phase"], registry=a).labels("pre").inc(2)
    Counter("netgain_x", "x", ["phase"], registry=b).labels("post").inc(5)
    Gauge("netgain_only_here", "y", registry=b).set(7)
    got = _values(merge([a.collect(), b.collect()]))
    assert got[("netgain_x_total", (("phase", "pre"),))] == 2
    assert got[("netgain_x_total", (("phase", "post"),))] == 5
    assert got[("netgain_only_here", ())] == 7


def test_families_survive_the_json_hand_over() -> None:
    """What a child sends the supervisor: every family's type, help, unit, samples, timestamps
    and exemplars as collected, infinities included."""
    reg = CollectorRegistry()
    h = Histogram("netgain_t_seconds", "t help", ["phase"], buckets=(0.1, 1.0), registry=reg)
    h.labels("pre").observe(0.05, exemplar={"trace_id": "abc"})
    h.labels("pre").observe(float("inf"))
    Counter("netgain_c", "c", unit="bytes", registry=reg).inc(3)
    Gauge("netgain_g", "g", registry=reg).set(-1.5)
    want = list(reg.collect())
    got = families_from_json(families_json(want))
    assert [(f.name, f.documentation, f.type, f.unit) for f in got] == [
        (f.name, f.documentation, f.type, f.unit) for f in want
    ]
    assert [f.samples for f in got] == [f.samples for f in want]
    ex = next(s.exemplar for f in got for s in f.samples if s.exemplar is not None)
    assert ex.labels == {"trace_id": "abc"} and ex.value == 0.05 and ex.timestamp is not None


def test_merged_collector_scrapes_children_and_skips_one_that_is_gone() -> None:
    """The supervisor's /metrics: its own registry plus every child's port, read over HTTP as
    JSON (exemplars kept); a child that exited is left out, the rest still add up."""
    local = CollectorRegistry()
    ServerMetrics(local, "m", "cpu")
    child = CollectorRegistry()
    child_metrics = ServerMetrics(child, "m", "cpu")
    lat = Histogram("netgain_child_latency_seconds", "l", buckets=(0.1, 1.0), registry=child)
    lat.observe(0.05, exemplar={"trace_id": "abc"})
    child_metrics.ready.labels(**child_metrics.labels).set(1)
    httpd, port = serve_families(child)
    with socket.socket() as s:  # a port nothing listens on: a child that has exited
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]
    try:
        merged = CollectorRegistry()
        merged.register(MergedCollector(local, lambda: [port, gone]))
        fams = list(merged.collect())
        got = _values(fams)
        assert got[("netgain_child_latency_seconds_count", ())] == 1
        bucket = next(
            s
            for f in fams
            for s in f.samples
            if s.name == "netgain_child_latency_seconds_bucket" and s.labels["le"] == "0.1"
        )
        assert bucket.exemplar is not None and bucket.exemplar.labels == {"trace_id": "abc"}
        ready = {k: v for k, v in got.items() if k[0] == "netgain_ready"}
        assert list(ready.values()) == [1]  # set by the child only
        text = generate_latest(merged).decode()  # a valid exposition, one family per name
        names = [f.name for f in text_string_to_metric_families(text)]
        assert len(names) == len(set(names))
    finally:
        httpd.shutdown()


def test_a_silent_connection_does_not_hold_a_childs_metrics_for_good() -> None:
    """One thread answers a child's metrics: a connection that never sends a request is dropped
    after the handler's timeout, and the supervisor's next read is answered."""
    reg = CollectorRegistry()
    Counter("netgain_c", "c", registry=reg).inc(2)
    httpd, port = serve_families(reg)
    try:
        httpd.RequestHandlerClass.timeout = 0.5  # type: ignore[attr-defined]
        with socket.create_connection(("127.0.0.1", port)):
            got = _values(scrape(port, timeout_s=10.0))
        assert got[("netgain_c_total", ())] == 2
    finally:
        httpd.shutdown()


# -- the slot ring -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        torch.tensor(7, dtype=torch.int64),
        torch.zeros((0, 3), dtype=torch.float16),
        torch.tensor([True, False, True]),
        torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),  # not contiguous
    ],
    ids=["float32-2d", "bfloat16", "int64-0d", "empty", "bool", "transposed"],
)
def test_ring_holds_a_tensor_as_raw_bytes(value: torch.Tensor) -> None:
    ring = Ring(4, 64 * 1024)
    ring.put(2, value)
    got = ring.get(2)
    assert got.dtype == value.dtype and got.shape == value.shape and torch.equal(got, value)


def test_ring_pickles_other_values_and_refuses_what_does_not_fit() -> None:
    ring = Ring(2, 4096)
    ring.put(0, {"text": "hello", "n": [1, 2, 3]})
    ring.put(1, torch.ones(16))
    assert ring.get(0) == {"text": "hello", "n": [1, 2, 3]}
    assert torch.equal(ring.get(1), torch.ones(16))  # a neighbour's write leaves it alone
    with pytest.raises(SlotTooSmall, match="4096-byte hand-off slot"):
        ring.put(1, torch.zeros(2048))
    with pytest.raises(SlotTooSmall):
        ring.put(0, b"x" * 5000)


def test_ring_holds_a_request_item_as_its_wire_bytes() -> None:
    from netgain.protos import inference_pb2 as pb

    ring = Ring(2, 4096)
    item = pb.Input(data=bytes(range(256)) * 4)
    ring.put(1, item)
    assert ring.get(1) == item and type(ring.get(1)) is pb.Input
    kind, _, _, nbytes, *_ = _ITEM.unpack_from(ring.mm, 4096)
    assert kind == INPUT and bytes(ring.view[4096 + ITEM_HEADER : 4096 + ITEM_HEADER + nbytes]) == (
        item.SerializeToString()
    )  # its wire bytes, not a pickle
    with pytest.raises(SlotTooSmall):  # its wire bytes too must fit
        ring.put(0, pb.Input(data=b"x" * 5000))


def test_ring_is_shared_with_a_forked_process() -> None:
    """The supervisor maps the rings before it forks: a child's write is the parent's read, and a
    tensor read is a view of that memory."""
    ring = Ring(2, 64 * 1024)
    ring.put(0, torch.zeros(4))
    view = ring.get(0)
    pid = os.fork()
    if pid == 0:
        try:
            ring.put(1, {"from": "child"})
            ring.get(0).numpy()[:] = 9.0  # numpy, not torch: no thread pool in the forked child
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ring.get(1) == {"from": "child"}
    assert torch.equal(view, torch.full((4,), 9.0))


def test_claim_table_chains_a_requests_slots() -> None:
    ring = Ring(8, 4096)
    assert (ring.claims[:, TAKER] == HANDED).all()  # nothing queued at the start
    ring.chain([5, 2, 7], seq=41)
    assert ring.chained(5, 3) == [5, 2, 7]
    assert ring.claims[5, SEQ] == 41 and ring.claims[5, TAKER] == QUEUED and ring.claims[7, NEXT] == -1
    ring.chain([3], seq=42)
    assert ring.chained(3, 1) == [3] and ring.claims[3, TAKER] == QUEUED


def test_records_round_trip_and_stay_atomic() -> None:
    slots = list(range(MAX_ITEMS_PER_RECORD))
    rec = encode_request(
        3, 99, 123, 456, 78, slots, "INVALID_ARGUMENT", "é" * MAX_MESSAGE, (b"t" * 16, b"s" * 8)
    )
    assert len(rec) <= select.PIPE_BUF  # the largest request record is one atomic write
    origin, code, n, seq, deadline, handed, pre, mlen, trace_id, span_id = REQUEST.unpack_from(rec)
    assert (origin, code, n, seq, deadline, handed, pre) == (3, 1, len(slots), 99, 123, 456, 78)
    assert mlen == MAX_MESSAGE and (trace_id, span_id) == (b"t" * 16, b"s" * 8)  # the message cut to fit
    reply = encode_reply(7, "NOT_A_CODE", 5, 2, (1, 2, 3, 4), "why")
    assert REPLY.unpack_from(reply) == (7, 7, 5, 2, 1, 2, 3, 4, 3) and reply[REPLY.size :] == b"why"


# -- records cut into writes and put back together ----------------------------------------------------


def test_atomic_chunks_join_whole_records_under_pipe_buf() -> None:
    records = [bytes([i % 251]) * (100 + 37 * i) for i in range(60)]
    chunks = atomic_chunks(records)
    assert b"".join(chunks) == b"".join(records)  # every record, in order
    assert all(len(c) <= select.PIPE_BUF for c in chunks)
    ends = {sum(len(r) for r in records[: i + 1]) for i in range(len(records))}
    at = 0
    for c in chunks:  # each write ends where a record ends
        at += len(c)
        assert at in ends
    assert len(chunks) < len(records)  # joined, not one write per record
    assert atomic_chunks([]) == []


class _Rows(Handler):
    name = "rows"

    def postprocess(self, row: Any) -> Any:
        return row.tolist()


class _Hold:
    """A pool that keeps what it is given (the requests wait for their replies)."""

    def submit(self, *args: Any) -> None:
        pass


def test_frontend_reassembles_replies_split_across_reads() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    ring = Ring(4, 4096)
    h = Handoff(_Rows(), [ring], 0, _Hold(), None, -1, r, clock=lambda: 10**9)  # type: ignore[arg-type]
    a, b = Pending("a", [0, 0], arrival_ns=0), Pending("b", [0], arrival_ns=0)
    h.put(a)
    h.put(b)
    (seq_a, (_, slots_a)), (seq_b, (_, slots_b)) = h.pending.items()
    for i, slot in enumerate([*slots_a, *slots_b]):
        ring.put(slot, torch.tensor([float(i)]))
    ok = encode_reply(seq_a, "OK", 3, 3, (10, 20, 30, 40))
    failed = encode_reply(seq_b, "RESOURCE_EXHAUSTED", 0, 0, (0, 0, 0, 0), "queue full")
    stream = ok + failed
    try:
        os.write(w, stream[:5])
        h._on_replies()
        assert len(h) == 2  # half a record: nothing answered yet
        os.write(w, stream[5 : len(ok) + 3])
        h._on_replies()
        assert len(h) == 1 and a.outputs == [[0.0], [1.0]] and a.batch_id == 3 and a.batch_size == 3
        assert a.spans["kernel"] == 30 and a.spans["queue"] == 10**9 - 100
        os.write(w, stream[len(ok) + 3 :])
        h._on_replies()
        assert len(h) == 0 and (b.code, b.message) == ("RESOURCE_EXHAUSTED", "queue full")
        assert sorted(h.free) == [0, 1, 2, 3]  # every slot back on the free list
    finally:
        os.close(w)
        os.close(r)


def test_device_reassembles_request_records_split_across_reads() -> None:
    """The device process's reader: records from two frontends' pipes, written in pieces that cut
    through heads, slot lists and messages, come out whole and in order per frontend."""
    pipes = [os.pipe(), os.pipe()]
    proc = DeviceProcess(
        ServeConfig(), "cpu", [Ring(2, 4096), Ring(2, 4096)], DevicePipes([p[0] for p in pipes], [])
    )
    taken: list[tuple[int, int, list[int], str]] = []

    def take(head: tuple[Any, ...], body: bytes) -> None:
        n, mlen = head[2], head[7]
        slots = [int.from_bytes(body[4 * i : 4 * i + 4], "little") for i in range(n)]
        taken.append((head[0], head[3], slots, body[4 * n : 4 * n + mlen].decode()))

    proc._take = take  # type: ignore[method-assign]
    reader = threading.Thread(target=proc._read)
    reader.start()
    sent = {
        0: [encode_request(0, s, 0, 0, 0, list(range(s)), "OK", "m" * s) for s in range(1, 40)],
        1: [encode_request(1, s, 0, 0, 0, [s], "INTERNAL", "bad") for s in range(1, 30)],
    }
    for origin, records in sent.items():
        data = b"".join(records)
        for i in range(0, len(data), 97):  # cuts that fall anywhere in a record
            os.write(pipes[origin][1], data[i : i + 97])
        os.close(pipes[origin][1])
    reader.join(10.0)
    assert not reader.is_alive()  # both writers closed: the reader is done
    for origin, records in sent.items():
        mine = [t for t in taken if t[0] == origin]
        assert [t[1] for t in mine] == list(range(1, len(records) + 1))
    assert (0, 5, [0, 1, 2, 3, 4], "mmmmm") in taken and (1, 4, [4], "bad") in taken
    for p in pipes:
        os.close(p[0])
