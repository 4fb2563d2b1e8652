"""GPU paths: run on the GPU machine (``pytest -m gpu``); skipped where CUDA is not available."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from conftest import ServerHandle, ServerLauncher
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from netgain.contract.phases import PHASES, parse_batch, parse_server_timing
from netgain.protos import pb
from netgain.server.device import DeviceOutOfMemory, DeviceRunner
from netgain.server.handlers.base import Handler
from netgain.server.handlers.image import ImageHandler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)"),
]

TEXT_OPTIONS = (
    "--handler-option",
    "layers=2",
    "--handler-option",
    "d_model=128",
    "--handler-option",
    "heads=4",
)


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), color=(seed % 256, 80, 160)).save(buf, format="PNG")
    return buf.getvalue()


def infer(handle: ServerHandle, data: bytes, rid: str) -> tuple[pb.InferResponse, dict[str, str]]:
    resp, call = handle.stub().Infer.with_call(
        pb.InferRequest(inputs=[pb.Input(data=data)]), metadata=[("x-request-id", rid)], timeout=30
    )
    return resp, {m.key: m.value for m in call.trailing_metadata()}


def check_gpu_spans(trailers: dict[str, str]) -> None:
    """Device spans from CUDA events are > 0; the phases add up to the total (the device stage's CPU
    time outside the events is charged to queue)."""
    t = parse_server_timing(trailers["server-timing"])
    assert list(t) == [*PHASES, "total"]
    assert t["h2d"] > 0 and t["kernel"] > 0 and t["d2h"] > 0, t
    assert abs(sum(t[p] for p in PHASES) - t["total"]) <= 0.02 * t["total"] + 0.02, t


@pytest.fixture(scope="module")
def image_cuda(start_server_module: ServerLauncher) -> ServerHandle:
    return start_server_module(
        "--model", "image", "--device", "cuda", "--handler-option", "size=64", "--max-queue-delay-ms", "10",
        "--warmup-batches", "1", "--sample-interval-s", "0.2",
    )  # fmt: skip


def test_image_on_cuda_has_device_spans(image_cuda: ServerHandle) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: infer(image_cuda, png(i), f"gpu-{i}"), range(16)))
    for resp, trailers in results:
        assert len(resp.outputs) == 1
        check_gpu_spans(trailers)
    assert max((parse_batch(tr["server-timing"]) or (0, 0))[1] for _, tr in results) > 1
    info = image_cuda.stub().ServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert info.device.startswith("cuda") and info.versions.get("gpu")


def test_gpu_metrics_present(image_cuda: ServerHandle) -> None:
    pytest.importorskip("pynvml", reason="GPU metrics need nvidia-ml-py")
    infer(image_cuda, png(1), "gpu-metrics")
    needed = {"netgain_gpu_utilization_ratio", "netgain_gpu_memory_used_bytes",
              "netgain_gpu_memory_total_bytes", "netgain_gpu_power_watts"}  # fmt: skip
    end = time.monotonic() + 10
    while True:
        families = {f.name: f for f in text_string_to_metric_families(image_cuda.metrics_text())}
        if needed <= {n for n, f in families.items() if f.samples} or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert needed <= set(families)
    total = families["netgain_gpu_memory_total_bytes"].samples[0]
    assert total.value > 1e9 and total.labels["gpu"] == "0" and total.labels["device"] == "cuda"
    kernel = [s for s in families["netgain_phase_duration_seconds"].samples
              if s.name.endswith("_sum") and s.labels["phase"] == "kernel"]  # fmt: skip
    assert kernel and kernel[0].value > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_text_on_cuda_with_reduced_precision(start_server: ServerLauncher, dtype: str) -> None:
    server = start_server("--model", "text", "--device", "cuda", "--dtype", dtype, *TEXT_OPTIONS,
                          "--warmup-batches", "1")  # fmt: skip
    resp, trailers = infer(server, b"the model serves a batch on the device", f"text-{dtype}")
    assert len(resp.outputs) == 1 and 0 < resp.outputs[0].score <= 1
    check_gpu_spans(trailers)
    assert server.stub().ServerInfo(pb.ServerInfoRequest(), timeout=10).dtype == dtype


def test_device_runner_matches_cpu() -> None:
    h = ImageHandler({"size": "32", "classes": "10"})
    batch = h.collate([h.preprocess(pb.Input(data=png(i))) for i in range(4)])
    cpu = DeviceRunner(h, "cpu")
    cpu.place(h.build_model())
    gpu = DeviceRunner(h, "cuda")
    gpu.place(h.build_model())
    want = cpu.run(cpu.prepare(batch))
    got = gpu.run(gpu.prepare(batch))
    assert got.output.device.type == "cpu" and got.output.dtype == torch.float32
    assert torch.allclose(got.output, want.output, atol=1e-3, rtol=1e-3)
    assert got.h2d_ns > 0 and got.kernel_ns > 0 and got.d2h_ns > 0


class OomUnlessSmall(Handler):
    name = "oom"

    def forward(self, model: Any, batch: Any) -> Any:
        if batch.shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return model(batch)


def test_oom_splits_batch_on_cuda() -> None:
    runner = DeviceRunner(OomUnlessSmall(), "cuda")
    runner.place(torch.nn.Identity())
    batch = torch.arange(4, dtype=torch.float32).view(4, 1)
    result = runner.run(runner.prepare(batch))
    assert torch.equal(result.output, batch) and result.splits == 3
    with pytest.raises(DeviceOutOfMemory, match="single item"):
        _oom_single()


def _oom_single() -> None:
    class AlwaysOom(Handler):
        def forward(self, model: Any, batch: Any) -> Any:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    runner = DeviceRunner(AlwaysOom(), "cuda")
    runner.place(torch.nn.Identity())
    runner.run(torch.ones(1, 1))


def test_bad_cuda_index_fails_cleanly(start_server: ServerLauncher) -> None:
    handle = start_server("--model", "null", "--device", f"cuda:{torch.cuda.device_count()}", wait=False)
    with pytest.raises(RuntimeError, match="exited with 2"):
        handle.wait_serving(60)
    err = (handle.workdir / "stderr.txt").read_text()
    assert "Traceback" not in err and "no such GPU" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("model", ["image", "text"])
def test_cuda_graphs_match_eager(model: str) -> None:
    """A graph replay gives the eager outputs for every batch size, padded rows never leak."""
    import random

    from netgain.server.handlers import create_handler

    opts = (
        {"size": "32"} if model == "image" else {"pad": "fixed", "layers": "2", "d_model": "64", "heads": "4"}
    )
    h = create_handler(model, opts)
    eager = DeviceRunner(h, "cuda")
    graphs = DeviceRunner(h, "cuda", cuda_graphs=True)
    assert graphs.cuda_graphs
    model_ = h.build_model()
    eager.place(model_)
    graphs.place(model_)
    rng = random.Random(0)
    for rows in (1, 3, 8, 5):
        batch = h.collate([h.preprocess(h.example_input(rng)) for _ in range(rows)])
        a = eager.run(eager.prepare(batch))
        b = graphs.run(graphs.prepare(batch))
        assert b.output.shape == a.output.shape
        assert torch.allclose(a.output, b.output, atol=1e-4, rtol=1e-4)
        assert b.kernel_ns > 0 and b.h2d_ns > 0
    assert sorted(k[0] for k in graphs.graphs.graphs) == [1, 4, 8]
    # Each graph times itself (event nodes first and last), so its kernel span excludes launch waits.
    entries = list(graphs.graphs.graphs.values())
    assert all(g.start is not None and (g.kernel_ms() or 0) > 0 for g in entries)


def test_cuda_graphs_server(start_server: ServerLauncher) -> None:
    handle = start_server(
        "--model",
        "image",
        "--device",
        "cuda",
        "--cuda-graphs",
        "--handler-option",
        "size=64",
        "--max-batch-size",
        "8",
        "--warmup-batches",
        "1",
    )
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: infer(handle, png(i), f"graph-{i}"), range(16)))
    for resp, trailers in results:
        assert len(resp.outputs) == 1
        check_gpu_spans(trailers)
