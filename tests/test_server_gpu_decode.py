"""``--handler-option decode=gpu`` on a GPU: JPEGs decoded by nvJPEG in batches and resized on the
device, in one process and with ``--workers``. Run on the GPU machine (``pytest -m gpu``); skipped
without CUDA or torchvision (the CPU side: test_handler_decode_gpu.py)."""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from conftest import ServerHandle, ServerLauncher
from PIL import Image

from netgain.contract.payloads import synthetic_jpeg
from netgain.contract.phases import PHASES, parse_batch, parse_server_timing
from netgain.protos import pb
from netgain.server.device import DeviceRunner
from netgain.server.handlers import nvjpeg
from netgain.server.handlers.base import PartialOutput
from netgain.server.handlers.image import ImageHandler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)"),
]
torchvision = pytest.importorskip("torchvision", reason="decode=gpu needs torchvision (nvJPEG)")

SIZE = 64
GPU_OPTIONS = {"decode": "gpu", "size": str(SIZE)}


def jpeg(seed: int, side: int = 120, mode: str = "RGB") -> bytes:
    """A photo-like baseline JPEG of exactly ``side`` x ``side`` (gradients plus noise, 4:2:0)."""
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    base = np.stack([xx, yy, (xx + yy) / 2], axis=-1) * 200.0
    pixels = np.clip(base + gen.normal(0.0, 25.0, size=(side, side, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").convert(mode).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), color=(seed % 256, 80, 160)).save(buf, format="PNG")
    return buf.getvalue()


# -- a JPEG whose header passes and that nvJPEG refuses --------------------------------------------
def _segment(data: bytes, marker: int) -> int:
    """Where the segment with ``marker`` (0xC0 for SOF0, 0xDA for SOS) starts, at its 0xFF."""
    at = 2
    while at + 4 <= len(data):
        assert data[at] == 0xFF, f"not a marker at {at}"
        if data[at + 1] == marker:
            return at
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    raise AssertionError(f"no marker 0xFF{marker:02X}")


def _odd_sampling(data: bytes) -> bytes:
    """Luma sampled 3x3 against chroma 1x1: legal JPEG syntax, a subsampling nvJPEG does not know."""
    out = bytearray(data)
    out[_segment(data, 0xC0) + 11] = 0x33  # FF C0, length, precision, height, width, count, id, sampling
    return bytes(out)


def _bad_scan_component(data: bytes) -> bytes:
    """The scan names a component the frame does not have."""
    out = bytearray(data)
    out[_segment(data, 0xDA) + 5] = 0x09  # FF DA, length, count, then the first component's id
    return bytes(out)


def _cut_body(data: bytes) -> bytes:
    """The entropy-coded data cut after 16 bytes, no end marker."""
    sos = _segment(data, 0xDA)
    return data[: sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big") + 16]


CANDIDATES: list[Callable[[bytes], bytes]] = [_odd_sampling, _bad_scan_component, _cut_body]


@pytest.fixture(scope="module")
def broken() -> bytes:
    """The first candidate whose header the server accepts (it goes to the device as bytes) and
    that nvJPEG refuses on its own: the request that must fail alone."""
    handler, tried = ImageHandler(GPU_OPTIONS), []
    for make in CANDIDATES:
        data = make(jpeg(99))
        assert handler.preprocess(pb.Input(data=data)).dim() == 1, make.__name__  # header passes
        try:
            torchvision.io.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), device="cuda")
        except (RuntimeError, ValueError):
            return data
        tried.append(make.__name__)
    raise AssertionError(f"nvJPEG decoded every broken candidate: {tried}")


# -- the decode and resize, against the CPU path -----------------------------------------------------
@pytest.mark.parametrize(("side", "mode"), [(40, "RGB"), (150, "RGB"), (300, "RGB"), (440, "L")])
def test_gpu_pixels_match_the_cpu_path(side: int, mode: str) -> None:
    """nvJPEG and libjpeg differ slightly (chroma upsampling, IDCT): the resized pixels stay within
    a small mean difference. Sides under 2 x 224 keep Pillow's JPEG draft (DCT scaling) out of it."""
    data = jpeg(side, side, mode)
    gpu = ImageHandler({"decode": "gpu"}).preprocess(pb.Input(data=data))
    pixels, invalid = nvjpeg.to_pixels([gpu], 224, torch.device("cuda"))
    cpu = ImageHandler({"resize": "torch"}).preprocess(pb.Input(data=data))
    assert invalid == {} and pixels.shape == (1, 3, 224, 224) and pixels.dtype == torch.uint8
    assert pixels.device.type == "cuda"
    diff = (pixels[0].cpu().float() - cpu.float()).abs()
    assert float(diff.mean()) < 3.0, float(diff.mean())
    # Channel order and orientation: each channel's mean follows the CPU path's.
    assert torch.allclose(pixels[0].cpu().float().mean((1, 2)), cpu.float().mean((1, 2)), atol=3.0)


def test_a_mixed_batch_keeps_its_order_and_fails_only_the_broken_item(broken: bytes) -> None:
    h = ImageHandler(GPU_OPTIONS)
    payloads = [jpeg(1), broken, png(2), jpeg(3, 200), jpeg(4, 64, "L")]
    items = [h.preprocess(pb.Input(data=d)) for d in payloads]
    device = torch.device("cuda")
    pixels, invalid = nvjpeg.to_pixels(h.collate(items), SIZE, device)
    assert list(invalid) == [1] and invalid[1].startswith("JPEG data is corrupt or not decodable by nvJPEG: ")
    assert "\n" not in invalid[1] and pixels.shape == (5, 3, SIZE, SIZE)
    for i in (0, 2, 3, 4):  # each row is that item decoded alone
        alone, none = nvjpeg.to_pixels([items[i]], SIZE, device)
        assert none == {} and int((pixels[i].int() - alone[0].int()).abs().max()) <= 1, i
    assert int(pixels[1].abs().sum()) == 0


def test_runner_charges_decode_and_resize_to_kernel(broken: bytes) -> None:
    h = ImageHandler({**GPU_OPTIONS, "classes": "10"})
    runner = DeviceRunner(h, "cuda", cuda_graphs=True)
    assert not runner.cuda_graphs  # a graph cannot replay the decode
    model = h.build_model()
    runner.place(model)
    batch = h.collate([h.preprocess(pb.Input(data=d)) for d in (jpeg(5), png(6), broken, jpeg(7))])
    assert runner.prepare(batch) is batch  # nothing pinned: the bytes go to nvJPEG as they are
    result = runner.run(batch)
    assert result.h2d_ns == 0 and result.kernel_ns > 0 and result.d2h_ns > 0
    assert (
        list(result.invalid) == [2] and result.output.shape == (4, 10) and result.output.device.type == "cpu"
    )
    with torch.inference_mode():
        again = h.forward(runner.model, batch)
    assert isinstance(again, PartialOutput)
    assert torch.allclose(
        again.output.float().cpu()[[0, 1, 3]], result.output[[0, 1, 3]], atol=1e-3, rtol=1e-3
    )


# -- the server, in both layouts --------------------------------------------------------------------
LAYOUTS = {"one-process": ("--workers", "0"), "workers": ("--workers", "2", "--pre-processes", "1")}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def server(request: pytest.FixtureRequest, start_server_module: ServerLauncher) -> ServerHandle:
    return start_server_module(
        "--model", "image", "--device", "cuda", "--handler-option", "decode=gpu",
        "--handler-option", f"size={SIZE}", "--max-batch-size", "16", "--max-queue-delay-ms", "100",
        "--warmup-batches", "1", *LAYOUTS[request.param],
    )  # fmt: skip


def call(handle: ServerHandle, data: bytes, rid: str) -> tuple[str, str, Any, dict[str, str]]:
    """(status code name, error details, response, trailers) of one Infer call."""
    try:
        resp, c = handle.stub().Infer.with_call(
            pb.InferRequest(inputs=[pb.Input(data=data)]), metadata=[("x-request-id", rid)], timeout=60
        )
        return "OK", "", resp, {m.key: m.value for m in c.trailing_metadata()}
    except grpc.RpcError as err:
        trailers = {m.key: m.value for m in (err.trailing_metadata() or ())}  # type: ignore[attr-defined]
        return err.code().name, err.details() or "", None, trailers  # type: ignore[attr-defined]


def call_all(
    handle: ServerHandle, payloads: list[bytes], tag: str
) -> list[tuple[str, str, Any, dict[str, str]]]:
    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(pool.map(lambda i: call(handle, payloads[i], f"{tag}-{i}"), range(len(payloads))))


def test_serves_jpegs_and_pngs_in_batches(server: ServerHandle) -> None:
    payloads = [jpeg(i, 100 + 10 * i) if i % 4 else png(i) for i in range(16)]
    results = call_all(server, payloads, "mix")
    for code, details, resp, trailers in results:
        assert code == "OK", details
        assert len(resp.outputs) == 1 and 0 <= resp.outputs[0].label < 1000 and 0 < resp.outputs[0].score <= 1
        t = parse_server_timing(trailers["server-timing"])
        assert list(t) == [*PHASES, "total"]
        assert t["h2d"] == 0 and t["kernel"] > 0 and t["d2h"] > 0, t  # the decode and its copies are kernel
        assert abs(sum(t[p] for p in PHASES) - t["total"]) <= 0.02 * t["total"] + 0.02, t
    assert max((parse_batch(tr["server-timing"]) or (0, 0))[1] for *_, tr in results) > 1


def test_a_broken_jpeg_fails_alone_in_its_batch(server: ServerHandle, broken: bytes) -> None:
    shared = False
    for attempt in range(3):  # until the broken request shares a batch with good ones
        results = call_all(server, [jpeg(10 + i) for i in range(7)] + [broken], f"broken{attempt}")
        *good, bad = results
        assert all(r[0] == "OK" for r in good), [r[:2] for r in good]
        assert bad[0] == "INVALID_ARGUMENT", bad[:2]
        assert bad[1].startswith("JPEG data is corrupt or not decodable by nvJPEG: ") and "\n" not in bad[1]
        batch = parse_batch(bad[3]["server-timing"])
        assert batch is not None
        if batch[0] in {(parse_batch(r[3]["server-timing"]) or (0, 0))[0] for r in good}:
            shared = True
            break
    assert shared, "the broken JPEG never shared a batch with good ones"
    code, details, _, _ = call(server, jpeg(42), "after-broken")
    assert code == "OK", details  # the decoder keeps serving


def test_jpeg_size_limit_is_the_same_in_both_layouts(server: ServerHandle) -> None:
    """Up to max_bytes (1 MiB) a JPEG is served, through the --workers hand-off slots too; over it,
    INVALID_ARGUMENT in one line."""
    under = synthetic_jpeg(random.Random(7), 900_000)
    over = synthetic_jpeg(random.Random(8), 1_300_000)
    assert len(under) < 1 << 20 < len(over)
    code, details, _, _ = call(server, under, "under-limit")
    assert code == "OK", details
    code, details, _, _ = call(server, over, "over-limit")
    assert code == "INVALID_ARGUMENT"
    limit = "over the limit of 1048576 with decode=gpu (handler option max_bytes)"
    assert details == f"JPEG is {len(over)} bytes, {limit}"
