"""Integration: real ``python -m netgain.server`` processes on 127.0.0.1 and real gRPC clients: one
shared image server."""

from __future__ import annotations

import importlib.util
import os
import time
from functools import partial
from typing import Any

import grpc
import pytest
from conftest import ServerHandle, ServerLauncher
from grpc_helpers import (
    CODE,
    SERVING,
    Reply,
    assert_full_timing,
    concurrently,
    infer,
    png,
    sample_value,
    wait_until,
)
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from netgain.contract.cores import cpu_list
from netgain.contract.phases import PHASES
from netgain.protos import SERVICE_NAME, InferenceStub, pb
from netgain.server.coldstart import COLD_START_PHASES

# Every test here starts a server process.
pytestmark = pytest.mark.slow


# -- the shared image server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_server(start_server_module: ServerLauncher) -> ServerHandle:
    return start_server_module(
        "--model",
        "image",
        "--handler-option",
        "size=32",
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "20",
        "--warmup-batches",
        "1",
        "--intra-op-threads",
        "1",
        "--sample-interval-s",
        "0.2",
    )


@pytest.fixture
def stub(image_server: ServerHandle) -> InferenceStub:
    return image_server.stub()


class TestImageServer:
    def test_concurrent_requests_form_batches(self, stub: InferenceStub) -> None:
        ids = [f"batch-{i}" for i in range(16)]
        replies = concurrently([partial(infer, stub, [pb.Input(data=png())], rid) for rid in ids])
        assert [r.code for r in replies] == [CODE.OK] * 16, [r.details for r in replies]
        assert [r.trailers["x-request-id"] for r in replies] == ids
        by_batch: dict[int, list[Reply]] = {}
        for r in replies:
            assert r.response is not None and len(r.response.outputs) == 1
            batch_id, size = r.batch
            assert (r.response.batch_id, r.response.batch_size) == (batch_id, size)
            by_batch.setdefault(batch_id, []).append(r)
        assert max(r.batch[1] for r in replies) > 1, "no request shared a batch"
        for members in by_batch.values():
            # Only our requests were in flight: a batch's size is the number of its members.
            assert {m.batch[1] for m in members} == {len(members)}
            assert len(members) <= 8
        # Same input, same model: same answer whichever batch it was in.
        assert (
            len(
                {
                    (r.response.outputs[0].label, round(r.response.outputs[0].score, 4))
                    for r in replies
                    if r.response
                }
            )
            == 1
        )

    def test_success_trailers(self, stub: InferenceStub) -> None:
        reply = infer(stub, [pb.Input(data=png()), pb.Input(data=png((0, 0, 255)))], "ok-1")
        assert reply.code == CODE.OK
        assert reply.trailers["x-request-id"] == "ok-1"
        assert_full_timing(reply)
        t = reply.timing
        assert t["queue"] >= 19.0  # a lone request waits the 20 ms delay for companions
        assert t["kernel"] > 0 and t["pre"] > 0
        assert t["h2d"] == t["d2h"] == 0  # on cpu
        batch_id, size = reply.batch
        assert batch_id >= 1 and size == 2
        assert reply.response is not None and len(reply.response.outputs) == 2
        assert reply.response.model == "image"

    def test_bad_image_fails_only_its_request_with_trailers(self, stub: InferenceStub) -> None:
        payloads = {"good-a": png(), "bad-b": b"\x89PNG not really", "good-c": png((1, 2, 3))}
        replies = dict(
            zip(
                payloads,
                concurrently([partial(infer, stub, [pb.Input(data=d)], rid) for rid, d in payloads.items()]),
                strict=True,
            )
        )
        bad = replies.pop("bad-b")
        assert bad.code == CODE.INVALID_ARGUMENT
        assert "not a decodable JPEG or PNG" in bad.details
        assert bad.trailers["x-request-id"] == "bad-b"
        assert_full_timing(bad)
        assert bad.timing["pre"] > 0 and bad.timing["kernel"] == 0
        assert all(r.code == CODE.OK for r in replies.values())
        # They were batched together, and the bad one did not take the others down.
        assert {r.batch[0] for r in replies.values()} == {bad.batch[0]}

    @pytest.mark.parametrize(
        ("request_id", "model", "inputs", "code", "message"),
        [
            ("empty-1", "", [], CODE.INVALID_ARGUMENT, "request has no inputs"),
            ("empty-2", "", [pb.Input()], CODE.INVALID_ARGUMENT, "input 0 is empty"),
            ("model-1", "text", [pb.Input(data=b"x")], CODE.NOT_FOUND, "model 'text' is not served here"),
            (
                "bad id!",
                "",
                [pb.Input(data=b"x")],
                CODE.INVALID_ARGUMENT,
                "x-request-id must be 1-128 characters",
            ),
            ("x" * 129, "", [pb.Input(data=b"x")], CODE.INVALID_ARGUMENT, "x-request-id must be"),
        ],
    )
    def test_rejected_requests_carry_trailers(
        self,
        stub: InferenceStub,
        request_id: str,
        model: str,
        inputs: list[pb.Input],
        code: grpc.StatusCode,
        message: str,
    ) -> None:
        reply = infer(stub, inputs, request_id, model=model)
        assert reply.code == code
        assert message in reply.details
        assert_full_timing(reply, admitted=False)
        assert reply.trailers["x-request-id"] == (request_id if "must" not in message else "invalid")
        assert reply.batch == (-1, 0)

    def test_matching_model_name_accepted_and_missing_id_assigned(
        self, image_server: ServerHandle, stub: InferenceStub
    ) -> None:
        reply = infer(stub, [pb.Input(data=png())], None, model="image")
        assert reply.code == CODE.OK
        assert reply.trailers["x-request-id"].startswith(f"srv{image_server.pid}-")

    def test_server_info(self, image_server: ServerHandle, stub: InferenceStub) -> None:
        info = stub.ServerInfo(pb.ServerInfoRequest(), timeout=10)
        assert (info.model, info.device, info.dtype) == ("image", "cpu", "float32")
        assert info.ready and info.pid == image_server.pid
        assert info.metrics_port == image_server.metrics_port
        assert dict(info.handler_options) == {"size": "32"}
        assert info.intra_op_threads == 1
        b = info.batching
        assert (b.max_batch_size, b.max_queue_delay_ms, b.max_queue_size, b.instances, b.pre_threads) == (
            8,
            20.0,
            256,
            1,
            2,
        )
        assert {"python", "torch", "grpc", "protobuf"} <= set(info.versions)
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"  # --event-loop auto
        assert info.versions["event_loop"].split()[0] == loop
        assert info.versions["grpc"] == grpc.__version__
        import torch

        assert info.versions["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
        usable = sorted(os.sched_getaffinity(image_server.pid))
        assert info.versions["server_cores"].startswith(f"{cpu_list(usable)} ({len(usable)} logical")
        assert [p.name for p in info.cold_start] == list(COLD_START_PHASES)
        ats = [p.at_s for p in info.cold_start]
        assert ats == sorted(ats) and all(p.duration_s >= 0 for p in info.cold_start)
        assert abs(time.time() - info.start_unix_s) < 600

    def test_health_serving(self, image_server: ServerHandle) -> None:
        assert image_server.health() == SERVING
        assert image_server.health(SERVICE_NAME) == SERVING

    def test_metrics(self, image_server: ServerHandle, stub: InferenceStub) -> None:
        lab = {"model": "image", "device": "cpu"}
        before_ok = sample_value(image_server, "netgain_requests_total", **lab, code="OK")
        before_bad = sample_value(image_server, "netgain_requests_total", **lab, code="INVALID_ARGUMENT")
        replies = concurrently([lambda: infer(stub, [pb.Input(data=png())]) for _ in range(3)])
        replies.append(infer(stub, [pb.Input(data=b"junk")]))
        assert [r.code for r in replies] == [CODE.OK] * 3 + [CODE.INVALID_ARGUMENT]
        # ">=": the recorder may still be counting earlier tests' requests when "before" was read.
        wait_until(
            lambda: (
                sample_value(image_server, "netgain_requests_total", **lab, code="OK") >= before_ok + 3
                and sample_value(image_server, "netgain_requests_total", **lab, code="INVALID_ARGUMENT")
                >= before_bad + 1
            ),
            what="request counters",
        )

        families = {fam.name: fam for fam in text_string_to_metric_families(image_server.metrics_text())}
        phases = {s.labels["phase"] for s in families["netgain_phase_duration_seconds"].samples}
        assert phases == set(PHASES)
        assert families["netgain_phase_duration_seconds"].type == "histogram"
        kernel_count = [
            s.value
            for s in families["netgain_phase_duration_seconds"].samples
            if s.name.endswith("_count") and s.labels["phase"] == "kernel"
        ]
        assert kernel_count and kernel_count[0] >= 3
        buckets = [
            float(s.labels["le"])
            for s in families["netgain_request_duration_seconds"].samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
        ]
        assert min(buckets) == pytest.approx(1e-5) and max(buckets) == pytest.approx(10.0)
        cold = {s.labels["phase"]: s.value for s in families["netgain_cold_start_seconds"].samples}
        assert set(cold) == set(COLD_START_PHASES) and all(v >= 0 for v in cold.values())
        assert cold["imports"] > 0
        assert families["netgain_ready"].samples[0].value == 1
        # An Info metric (OpenMetrics type info; a gauge of value 1 in the text format).
        assert [s.labels["max_batch_size"] for s in families["netgain_server_info"].samples] == ["8"]
        assert "# TYPE netgain_server info" in image_server.metrics_text(openmetrics=True)
        assert [s.value for s in families["netgain_device_instances"].samples] == [1.0]
        # Prometheus conventions: no gauge beside a counter that rate() derives it from.
        for gone in ("netgain_kernel_busy_ratio", "netgain_process_cpu_ratio", "netgain_thread_cpu_ratio"):
            assert gone not in families, gone
        for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_start_time_seconds"):
            assert name in families, name
        for name in (
            "netgain_queue_depth_requests",
            "netgain_in_flight_requests",
            "netgain_batch_size_items",
            "netgain_batches",
            "netgain_kernel_busy_seconds",
        ):
            assert name in families, name
        wait_until(
            lambda: (
                'netgain_thread_cpu_seconds_total{device="cpu",model="image",role="frontend"}'
                in image_server.metrics_text()
            ),
            what="CPU samplers",
        )
        assert not [n for n in families if n.startswith("netgain_gpu_")]  # absent, not zero, without a GPU
        # Labels never hold request ids.
        assert not any("request_id" in s.labels for fam in families.values() for s in fam.samples)

    def test_openmetrics_exemplars_carry_request_ids(
        self, image_server: ServerHandle, stub: InferenceStub
    ) -> None:
        assert infer(stub, [pb.Input(data=png())], "exemplar-42").code == CODE.OK

        def exemplar_ids() -> set[str]:
            out: set[str] = set()
            for fam in parse_openmetrics(image_server.metrics_text(openmetrics=True)):
                for s in fam.samples:
                    if s.exemplar is not None and fam.name in (
                        "netgain_request_duration_seconds",
                        "netgain_phase_duration_seconds",
                    ):
                        out.add(s.exemplar.labels["request_id"])
            return out

        wait_until(lambda: "exemplar-42" in exemplar_ids(), what="exemplar-42 on an exemplar")
        # The Prometheus text format (no exemplars) still parses, and holds no request id anywhere.
        assert "exemplar-42" not in image_server.metrics_text()

    def test_span_log_one_line_per_request(self, image_server: ServerHandle, stub: InferenceStub) -> None:
        # The longest id allowed (128 characters) must not break the exemplar (OpenMetrics caps
        # an exemplar's labels at 128 characters) nor lose its span-log line.
        ids = ["span-0", "span-1", "s" * 128, "span-3"]
        replies = concurrently([partial(infer, stub, [pb.Input(data=png())], rid) for rid in ids[:3]])
        replies.append(infer(stub, [pb.Input(data=b"nope")], ids[3]))

        def lines() -> list[dict[str, Any]]:
            got = [rec for rec in image_server.span_lines() if rec["id"] in ids]
            return got if len(got) >= 4 else []

        recs = wait_until(lines, what="span log lines")
        time.sleep(0.1)
        recs = [rec for rec in image_server.span_lines() if rec["id"] in ids]
        assert sorted(rec["id"] for rec in recs) == sorted(ids)  # exactly one line each
        by_id = {rec["id"]: rec for rec in recs}
        for rid, reply in zip(ids, replies, strict=True):
            rec = by_id[rid]
            assert rec["code"] == reply.code.name
            assert (rec["batch_id"], rec["batch_size"]) == reply.batch
            assert rec["total_ms"] == pytest.approx(reply.timing["total"], abs=0.002)
            assert {f"{p}_ms" for p in PHASES} <= set(rec)
            assert abs(rec["arrival_unix_ns"] / 1e9 - time.time()) < 60
