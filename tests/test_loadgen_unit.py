"""Load generator pieces without processes: schedules, sharding, payloads, trailers, histograms, the sink."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from netgain.contract.messages import Plan
from netgain.contract.records import RECORD_COLUMNS, empty_columns
from netgain.loadgen.payloads import PayloadFactory, size_bucket
from netgain.loadgen.runner.grpc_sender import parse_trailers
from netgain.loadgen.runner.live import LIVE_BOUNDS
from netgain.loadgen.runner.scrape import Samples
from netgain.loadgen.runner.sink import RecordSink
from netgain.loadgen.runner.wire import records_batch
from netgain.loadgen.schedule import from_trace
from netgain.loadgen.traces import synthesize
from netgain.protos import pb
from netgain.stats import histogram as nh


def test_seeded_schedule_is_exact() -> None:
    a = from_trace(synthesize("poisson", 200.0, 5.0, seed=7), warmup_s=1.0)
    b = from_trace(synthesize("poisson", 200.0, 5.0, seed=7), warmup_s=1.0)
    c = from_trace(synthesize("poisson", 200.0, 5.0, seed=8), warmup_s=1.0)
    assert np.array_equal(a.t_ns, b.t_ns) and a.digest == b.digest
    assert a.digest != c.digest
    assert np.all(np.diff(a.t_ns) >= 0)
    assert a.warmup_ns == 1_000_000_000
    assert 800 < len(a) < 1200


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_sharding_keeps_every_request_exactly_once(workers: int) -> None:
    sched = from_trace(synthesize("gamma", 300.0, 3.0, seed=1, items="1:0.5,4:0.5"))
    shards = [sched.shard(w, workers) for w in range(workers)]
    idx = np.concatenate([s.index for s in shards])
    assert sorted(idx.tolist()) == list(range(len(sched)))
    for s in shards:  # each shard keeps its rows' times, sizes and items
        assert np.array_equal(s.t_ns, sched.t_ns[s.index])
        assert np.array_equal(s.items, sched.items[s.index])
    with pytest.raises(ValueError):
        sched.shard(workers, workers)


def _plan(sched: Any, worker: int, workers: int, max_in_flight: int) -> Plan:
    """An open-loop plan for ``sched`` (one shard of it) against a target nobody listens on."""
    return Plan(
        run_id="r",
        worker=worker,
        workers=workers,
        targets=["127.0.0.1:1"],
        model="null",
        handler_options={},
        seed=0,
        mode="open",
        warmup_ns=0,
        timeout_s=1.0,
        max_in_flight=max_in_flight,
        index=sched.index.tobytes(),
        t_ns=sched.t_ns.tobytes(),
        size=sched.size.tobytes(),
        items=sched.items.tobytes(),
    )


def test_plan_round_trips_arrays() -> None:
    sched = from_trace(synthesize("constant", 10.0, 2.0)).shard(1, 2)
    plan = _plan(sched, worker=1, workers=2, max_in_flight=10)
    back = Plan.from_msg(plan.to_msg())
    idx, t_ns, size, items = back.arrays()
    assert np.array_equal(idx, sched.index) and np.array_equal(t_ns, sched.t_ns)
    assert np.array_equal(items, sched.items) and np.array_equal(size, sched.size)


def test_payloads_are_deterministic_and_match_the_model() -> None:
    a = PayloadFactory("tabular", {"features": "5"}, seed=3)
    b = PayloadFactory("tabular", {"features": "5"}, seed=3)
    body = a.request_bytes(11, 0, 3)
    assert body == b.request_bytes(11, 0, 3)
    req = pb.InferRequest.FromString(body)
    assert len(req.inputs) == 3 and all(len(x.features) == 5 for x in req.inputs)
    img = pb.InferRequest.FromString(PayloadFactory("image", seed=1).request_bytes(0, 30_000, 1))
    assert img.inputs[0].data[:2] == b"\xff\xd8"  # a real JPEG
    assert 0.7 * 30_000 < len(img.inputs[0].data) < 1.3 * 30_000
    txt = pb.InferRequest.FromString(PayloadFactory("text", seed=1).request_bytes(0, 500, 1))
    assert abs(len(txt.inputs[0].data) - 500) < 20
    with pytest.raises(ValueError, match="cannot make payloads"):
        PayloadFactory("nope")


def test_size_bucket_two_significant_digits() -> None:
    assert size_bucket(0) == 0
    assert size_bucket(12_345) == 12_000
    assert size_bucket(987) == 990
    assert size_bucket(7) == 7


def test_parse_trailers() -> None:
    md = (
        (
            "server-timing",
            "queue;dur=1.5, pre;dur=0.25, h2d;dur=0, kernel;dur=3, d2h;dur=0, post;dur=0.5, total;dur=5.3, "
            "batch;id=42;size=8",
        ),
    )
    out = parse_trailers(md)
    assert out["queue_ms"] == 1.5 and out["kernel_ms"] == 3.0 and out["server_total_ms"] == 5.3
    assert out["batch_id"] == 42 and out["batch_size"] == 8
    empty = parse_trailers(())
    assert empty["queue_ms"] is None and empty["batch_id"] is None
    bad = parse_trailers((("server-timing", "queue;dur=abc, batch;id=1;size=1"),))
    assert bad["queue_ms"] is None and bad["batch_id"] is None
    unbatched = parse_trailers((("server-timing", "queue;dur=0.5, batch;id=-1;size=0"),))
    assert unbatched["queue_ms"] == 0.5 and unbatched["batch_id"] is None and unbatched["batch_size"] is None


def test_live_histogram_percentiles_within_one_percent() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(mean=np.log(5e6), sigma=0.8, size=50_000).astype(np.int64)  # ~5 ms
    h = nh.Histogram(LIVE_BOUNDS)
    h.add(values[:20_000] / 1e9)
    h.add(values[20_000:] / 1e9)
    for q in (50, 90, 99, 99.9):
        exact = np.percentile(values, q, method="inverted_cdf") / 1e6
        assert abs(h.quantile(q / 100) * 1e3 - exact) / exact < 0.011
    assert np.isnan(nh.Histogram(LIVE_BOUNDS).quantile(0.5))


def _histogram_samples(registry: Any) -> dict[tuple[str, str], float]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for smp in fam.samples:
            if not smp.name.endswith("_created"):
                out[(smp.name, smp.labels.get("le", ""))] = smp.value
    return out


def test_array_histogram_exports_what_prometheus_histogram_does() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    DURATION_BUCKETS, ArrayHistogram = nh.DURATION_BUCKETS, nh.PrometheusHistogram

    rng = np.random.default_rng(1)
    # lognormal around 5 ms, every bucket bound itself (le: counted in that bucket), 0 and past +Inf
    values = np.concatenate([rng.lognormal(np.log(5e-3), 1.5, 5_000), DURATION_BUCKETS, [0.0, 1e4]])
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = ArrayHistogram("x_seconds", "x", DURATION_BUCKETS, ours_reg)
    ref = Histogram("x_seconds", "x", buckets=DURATION_BUCKETS, registry=ref_reg)
    ours.observe_many(values[:1_000])
    ours.observe_many(values[1_000:])
    ours.observe_many(np.array([]))
    ours.observe_many(np.array([np.nan]))  # dropped (prometheus_client buckets none but poisons _sum)
    for v in values:
        ref.observe(float(v))
    got, want = _histogram_samples(ours_reg), _histogram_samples(ref_reg)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    assert got[("x_seconds_count", "")] == values.size
    # One histogram with finer buckets (the live view's, DURATION_BUCKETS among them) exports the same.
    fine_reg = CollectorRegistry()
    fine = ArrayHistogram("x_seconds", "x", DURATION_BUCKETS, fine_reg, hist=nh.Histogram(LIVE_BOUNDS))
    fine.observe_many(values)
    assert _histogram_samples(fine_reg) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="bounds of the histogram"):
        ArrayHistogram("w_seconds", "w", [0.0015], hist=nh.Histogram(DURATION_BUCKETS))
    with_inf = ArrayHistogram("y_seconds", "y", [*DURATION_BUCKETS, float("inf")])
    assert with_inf.bounds.tolist() == list(DURATION_BUCKETS)
    with pytest.raises(ValueError, match="strictly increasing"):
        ArrayHistogram("z_seconds", "z", [0.1, 0.01])


def _cols(indices: list[int]) -> dict[str, list[object]]:
    cols = empty_columns()
    for i in indices:
        row = dict.fromkeys(RECORD_COLUMNS)
        row.update(
            index=i,
            request_id=f"r-{i}",
            worker=0,
            target="t",
            warmup=False,
            scheduled_ns=i * 10,
            sent_ns=i * 10 + 1,
            done_ns=i * 10 + 5,
            status="OK",
            items=1,
            request_bytes=3,
            response_bytes=2,
        )
        for c in RECORD_COLUMNS:
            cols[c].append(row[c])
    return cols


def test_sink_writes_incrementally_and_fills_missing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "requests.parquet")
    sink = RecordSink(path, scheduled=10, flush_rows=3)
    sink.add_batch(records_batch(_cols([0, 1, 2, 3])))
    sink.add_batch(records_batch(_cols([5, 7])))
    assert sink.written == 4  # flushed once past 3 rows
    missing = sink.missing().tolist()
    assert missing == [4, 6, 8, 9]
    fill = empty_columns()
    for i in missing:
        for c in RECORD_COLUMNS:
            fill[c].append({"index": i, "status": "NOT_SENT", "request_id": f"r-{i}"}.get(c))
    sink.close(fill)
    t = pq.read_table(path)
    assert t.num_rows == 10
    assert sorted(t.column("index").to_pylist()) == list(range(10))
    statuses = dict(zip(t.column("index").to_pylist(), t.column("status").to_pylist(), strict=True))
    assert statuses[4] == "NOT_SENT" and statuses[5] == "OK"
    assert t.schema.names == list(RECORD_COLUMNS)


def test_records_cross_the_wire_as_arrow_and_duplicates_are_counted(tmp_path: Any) -> None:
    from netgain.loadgen.runner.live import LiveStats
    from netgain.loadgen.runner.wire import decode_records, encode_records

    cols = _cols([0, 1, 2])
    cols["done_ns"][2] = None  # dropped: never answered
    cols["sent_ns"][2] = None
    cols["status"][2] = "DROPPED"
    cols["queue_ms"][0] = 0.125
    batch = decode_records(encode_records(cols))
    assert batch.to_pydict() == cols  # None stays None, values exact
    with pytest.raises(ValueError):
        decode_records(b"not arrow")
    sink = RecordSink(str(tmp_path / "r.parquet"), scheduled=3)
    sink.add_batch(batch)
    sink.add_batch(records_batch(_cols([1, 1, 9])))  # 1 twice more, 9 outside the schedule
    assert sink.duplicates == 2 and sink.extra_rows == 1 and sink.missing().tolist() == []
    sink.close()
    live = LiveStats(None, out=io.StringIO())
    live.add(batch)
    assert (live.ok, live.dropped, live.errors, live.sent) == (2, 1, 0, 2)
    assert live.latency.total == 2
    # the client metrics take the same records: answered ones only, latency from the schedule
    from prometheus_client import CollectorRegistry

    from netgain.loadgen.runner.live import ClientMetrics

    reg = CollectorRegistry()
    served = LiveStats(ClientMetrics(reg), out=io.StringIO())
    served.add(batch)
    warm = _cols([3])
    warm["warmup"][0] = True  # answered during the warm-up: counted as sent, kept out of latency
    served.add(records_batch(warm))
    got = _histogram_samples(reg)
    assert got[("netgain_client_latency_seconds_count", "")] == 2
    assert got[("netgain_client_latency_seconds_sum", "")] == pytest.approx(2 * 5e-9)  # done - scheduled
    assert got[("netgain_client_send_lag_seconds_sum", "")] == pytest.approx(2 * 1e-9)
    assert got[("netgain_client_dropped_total", "")] == 1


def test_worker_does_not_import_parquet() -> None:
    import subprocess
    import sys

    code = "import sys, loadgen.runner.worker; print('pyarrow.parquet' in sys.modules)"
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert res.stdout.strip() == "False"  # it only encodes records; the master writes Parquet


def test_frames_round_trip_and_end_of_stream() -> None:
    import io

    from netgain.loadgen.runner import frames

    records = {"index": [1, 2], "sent_ns": [None, 5], "body": b"\x00\xff"}
    buf = io.BytesIO()
    frames.write_frame(buf, frames.RECORDS, records)
    frames.write_frame(buf, frames.DONE, {"sent": 2})
    whole = buf.getvalue()
    inp = io.BytesIO(whole)
    assert frames.read_frame(inp) == (frames.RECORDS, records)
    assert frames.read_frame(inp) == (frames.DONE, {"sent": 2})
    assert frames.read_frame(inp) is None  # clean end
    assert frames.read_frame(io.BytesIO(whole[:-3])) is not None  # first frame intact
    cut = io.BytesIO(whole[: len(whole) - 3])
    frames.read_frame(cut)
    assert frames.read_frame(cut) is None  # a frame cut short is an end, not garbage


def test_samples_stream_to_disk_in_row_groups(tmp_path: Any) -> None:
    path = str(tmp_path / "samples.parquet")
    samples = Samples(path, flush_rows=3)
    for i in range(7):
        samples.add(float(i), "server:a", "netgain_queue_depth_requests", float(i * 10))
        assert len(samples.rows) < 3  # never more than a row group held in memory
    samples.close()
    table = pq.read_table(path)
    assert table.column("t_s").to_pylist() == [float(i) for i in range(7)]
    assert table.column("value").to_pylist() == [float(i * 10) for i in range(7)]
    assert pq.ParquetFile(path).num_row_groups == 3  # 3 + 3 + the last 1


def test_samples_are_written_within_flush_s_even_when_few(tmp_path: Any) -> None:
    now = [0.0]
    path = str(tmp_path / "samples.parquet")
    samples = Samples(path, flush_rows=1000, flush_s=30.0, clock=lambda: now[0])
    samples.add(0.0, "server:a", "netgain_queue_depth_requests", 1.0)
    now[0] = 29.0
    samples.add(29.0, "server:a", "netgain_queue_depth_requests", 2.0)
    assert len(samples.rows) == 2  # neither bound reached yet
    now[0] = 31.0
    samples.add(31.0, "server:a", "netgain_queue_depth_requests", 3.0)
    assert samples.rows == [] and samples.written == 3
    samples.close()
    assert pq.read_table(path).column("value").to_pylist() == [1.0, 2.0, 3.0]


def test_samples_without_rows_still_write_a_readable_file(tmp_path: Any) -> None:
    path = str(tmp_path / "samples.parquet")
    Samples(path).close()
    table = pq.read_table(path)
    assert table.num_rows == 0 and table.column_names == ["t_s", "source", "metric", "labels", "value"]


def test_precise_selector_waits_out_its_timeout_and_wakes_on_input() -> None:
    import socket
    import threading
    import time

    from netgain.loadgen.runner.engine import SPIN_S, PreciseSelector

    a, b = socket.socketpair()
    sel = PreciseSelector()
    try:
        sel.register(a, 1)  # EVENT_READ
        # Nothing to read: it returns empty only once the whole timeout has passed (never early,
        # which would make asyncio spin a pass for nothing).
        for timeout in (0.0001, 0.0008):
            t0 = time.perf_counter()
            assert sel.select(timeout) == []
            assert time.perf_counter() - t0 >= timeout
        # A wait no longer than SPIN_S is spun whole and counted as spun. (After a nap the spun
        # stretch can be empty: on a loaded machine a nap may overshoot the deadline.)
        spun = sel.spun_s
        assert sel.select(SPIN_S / 2) == []
        assert sel.spun_s > spun
        # Input arriving in the nap-and-poll stretch ends the wait with that key.
        timer = threading.Timer(0.0003, b.send, args=(b"x",))
        timer.start()
        ready = sel.select(0.001)
        timer.join()
        if not ready:  # the writer thread did not run within the window (a loaded machine)
            ready = sel.select(0.001)
        assert [key.fileobj for key, _ in ready] == [a]
    finally:
        sel.close()
        a.close()
        b.close()


class _FakeCall:
    """Stands in for a grpc.aio call: answers ``delay_s`` after it was made."""

    def __init__(self, delay_s: float) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        self.fut: Any = loop.create_future()
        loop.call_later(delay_s, self.fut.set_result, b"ok")

    def __await__(self) -> Any:
        return self.fut.__await__()

    async def trailing_metadata(self) -> tuple[()]:
        return ()


def _open_engine(rate: float, seconds: float, max_in_flight: int, delay_s: float, call: Any = None) -> Any:
    import asyncio
    import io
    import time

    from netgain.loadgen.runner.engine import Engine

    sched = from_trace(synthesize("poisson", rate, seconds, seed=3))
    plan = _plan(sched, worker=0, workers=1, max_in_flight=max_in_flight)
    engine = Engine(plan, io.BytesIO())
    engine.prepare()
    engine.sender.calls = [[call or (lambda body, metadata, timeout: _FakeCall(delay_s))]]
    engine.epoch_perf_ns = time.perf_counter_ns() + 20_000_000
    asyncio.run(asyncio.wait_for(engine._run_open(), seconds + 10.0))  # a hang fails, not stalls
    return engine


def test_open_loop_sends_each_request_once_never_early_and_drops_over_the_cap() -> None:
    engine = _open_engine(rate=400.0, seconds=1.0, max_in_flight=1000, delay_s=0.002)
    c = engine.cols
    assert sorted(c["index"]) == list(range(len(engine.index)))  # every request has one row
    assert all(s == "OK" for s in c["status"])
    sched = np.asarray(c["scheduled_ns"])
    sent = np.asarray(c["sent_ns"])
    assert np.all(sent >= sched)  # never before its time
    assert np.all(np.asarray(c["done_ns"]) - sent >= 2_000_000)  # latency includes the service time
    # Answers slower than arrivals with a cap of 2 in flight: the overflow is DROPPED, not delayed.
    engine = _open_engine(rate=400.0, seconds=1.0, max_in_flight=2, delay_s=0.05)
    status = engine.cols["status"]
    assert len(status) == len(engine.index)
    assert 0 < status.count("DROPPED") < len(status) and status.count("OK") > 0
    assert engine.in_flight == 0


def test_open_loop_ends_with_the_error_of_a_failing_send() -> None:
    def broken(body: bytes, metadata: Any, timeout: float) -> Any:
        raise RuntimeError("channel is closed")

    # The send runs in a timer callback; its error must end the run, not be logged and hang it.
    with pytest.raises(RuntimeError, match="channel is closed"):
        _open_engine(rate=100.0, seconds=0.5, max_in_flight=10, delay_s=0.001, call=broken)


def test_wait_ready_says_when_there_is_no_health_service() -> None:
    import subprocess
    import sys
    import time
    from concurrent import futures

    import grpc

    from netgain.errors import NetgainError
    from netgain.experiments.orchestrate import ServerProcess

    bare = grpc.server(futures.ThreadPoolExecutor(1))  # a gRPC server with no services at all
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sp = ServerProcess([], ready_timeout_s=30.0)
        sp.proc, sp.grpc_port, sp.spawned_at = stand_in, port, time.time()
        t0 = time.monotonic()
        with pytest.raises(NetgainError, match=r"no grpc\.health\.v1 service"):
            sp.wait_ready()
        assert time.monotonic() - t0 < 10.0  # said at once, not after the 30-s timeout
    finally:
        stand_in.kill()
        stand_in.wait(10)
        bare.stop(0)


def test_channel_options_round_robin_only_for_dns_targets() -> None:
    import json

    from netgain.loadgen.runner.grpc_sender import CHANNEL_OPTIONS, ROUND_ROBIN, channel_options

    assert channel_options("127.0.0.1:50051", 1) == CHANNEL_OPTIONS  # pick_first, shared pool
    assert channel_options("127.0.0.1:50051", 4) == [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    rr = channel_options("dns:///netgain-server-cpu-pods:50051", 2)
    assert rr == [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1), ROUND_ROBIN]
    assert ROUND_ROBIN[0] == "grpc.service_config"
    assert json.loads(ROUND_ROBIN[1]) == {"loadBalancingConfig": [{"round_robin": {}}]}
    assert ROUND_ROBIN in channel_options("dns://10.0.0.10/name:50051", 1)


def test_round_robin_service_config_spreads_calls_over_addresses() -> None:
    """Real channels: a plain 127.0.0.1:PORT and a dns:/// name work with the engine's options,
    and the service config spreads one channel's calls over every resolved address."""
    from concurrent import futures

    import grpc

    from netgain.loadgen.runner.grpc_sender import ROUND_ROBIN, channel_options

    hits: list[int] = []
    servers, ports = [], []
    for k in range(2):

        def handler(req: bytes, ctx: Any, k: int = k) -> bytes:
            hits.append(k)
            return req

        srv = grpc.server(futures.ThreadPoolExecutor(2))
        rpc = grpc.unary_unary_rpc_method_handler(handler)
        srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.S", {"M": rpc})])
        ports.append(srv.add_insecure_port("127.0.0.1:0"))
        srv.start()
        servers.append(srv)
    try:
        for target in (f"127.0.0.1:{ports[0]}", f"dns:///127.0.0.1:{ports[0]}"):
            with grpc.insecure_channel(target, channel_options(target, 2)) as ch:
                assert ch.unary_unary("/t.S/M")(b"x", timeout=10) == b"x"
        assert hits == [0, 0]
        hits.clear()
        both = f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"  # two addresses, as a headless name
        with grpc.insecure_channel(both, [ROUND_ROBIN]) as ch:
            grpc.channel_ready_future(ch).result(timeout=10)
            for _ in range(20):
                ch.unary_unary("/t.S/M")(b"x", timeout=10, wait_for_ready=True)
        assert set(hits) == {0, 1}, hits
    finally:
        for srv in servers:
            srv.stop(None)


@pytest.mark.parametrize("max_error_rate", [None, 1.0])
def test_a_run_in_which_every_request_failed_exits_5_not_invalid(
    max_error_rate: float | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The target failed every request: exit 5 (REQUESTS FAILED), not 3 (INVALID), and never 0,
    even when --max-error-rate allows every failure."""
    from netgain.loadgen.runner import results
    from netgain.loadgen.runner.config import LoadConfig
    from netgain.loadgen.runner.live import LiveStats

    cols = _cols([0, 1, 2, 3])
    cols["status"] = ["INTERNAL"] * 4
    live = LiveStats(None, out=io.StringIO())
    live.add(records_batch(cols))
    cfg = LoadConfig(targets=["t"], out="run", max_error_rate=max_error_rate)
    counts = results.count(4, live, 0, 0, 4)
    reasons = results.invalid_reasons(cfg, live, counts, {}, {})
    assert reasons == []
    assert results.verdict(cfg, live, counts, reasons) == results.EXIT_FAILED
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith(": REQUESTS FAILED: 4 of 4 measured requests failed (4 INTERNAL); none succeeded")


def test_sink_merges_small_messages_while_a_row_group_fills(tmp_path: Any) -> None:
    """Many one-row messages are held as a few merged batches and written in arrival order."""
    from netgain.loadgen.runner.sink import COMPACT_BATCHES

    path = str(tmp_path / "r.parquet")
    sink = RecordSink(path, scheduled=None, flush_rows=10_000)
    order = [int(i) for i in np.random.default_rng(3).permutation(500)]
    for i in order:
        sink.add_batch(records_batch(_cols([i])))
    assert len(sink._batches) < 500 // COMPACT_BATCHES + COMPACT_BATCHES
    sink.close()
    assert pq.read_table(path).column("index").to_pylist() == order
