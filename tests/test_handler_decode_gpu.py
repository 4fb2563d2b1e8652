"""The image handlers' ``decode=gpu`` on a machine without a GPU or torchvision: the option, the
header-only pre-processing, the list batch, the server's refusal without CUDA, and the decode-and-
resize path run on the CPU with Pillow standing in for nvJPEG (the GPU itself:
test_server_gpu_decode.py)."""

from __future__ import annotations

import io
import random
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_netgain
from PIL import Image

from netgain.contract.payloads import synthetic_jpeg
from netgain.protos import pb
from netgain.server.batching.pipeline import Pipeline, PipelineConfig
from netgain.server.batching.queue import Pending, RequestQueue
from netgain.server.device import DeviceOutOfMemory, DeviceRunner
from netgain.server.handlers import nvjpeg
from netgain.server.handlers.base import Handler, InvalidInput, PartialOutput
from netgain.server.handlers.check import check_handler
from netgain.server.handlers.image import ImageHandler
from netgain.server.handlers.resnet import ResNet50Handler
from netgain.server.multiproc.device_proc import SlotHandler
from netgain.server.multiproc.slots import ITEM_HEADER, Ring, SlotRef
from netgain.server.multiproc.supervisor import measure_items

SMALL = {"size": "32", "classes": "10"}


def encode(fmt: str, size: tuple[int, int] = (50, 40), mode: str = "RGB", seed: int = 0) -> bytes:
    """A noisy image (so decoders and resizers have something to differ on)."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), dtype=torch.uint8, generator=gen)
    img = Image.fromarray(pixels.numpy(), "RGB")
    buf = io.BytesIO()
    (img if mode == "RGB" else img.convert(mode)).save(buf, format=fmt)
    return buf.getvalue()


def broken_body(seed: int = 0) -> bytes:
    """A JPEG whose header is whole and whose entropy-coded data is cut short: Pillow opens it,
    decoding it fails."""
    data = encode("JPEG", (64, 48), seed=seed)
    return data[: data.index(b"\xff\xda") + 40]


def pillow_decode(datas: list[Any], device: Any) -> list[Any]:
    """Stands in for nvJPEG: RGB channel-first uint8 images, and like torchvision's batched call it
    raises for the whole list when one item cannot be decoded."""
    out = []
    for d in datas:
        assert d.dim() == 1 and d.dtype == torch.uint8 and d.device.type == "cpu"
        try:
            img = Image.open(io.BytesIO(d.numpy().tobytes())).convert("RGB")
        except OSError as exc:
            raise RuntimeError(
                f"Error while decoding JPEG images: {exc}\nException raised from decode"
            ) from None
        out.append(torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous().to(device))
    return out


@pytest.fixture
def fake_nvjpeg(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """nvJPEG replaced by Pillow; the list records each call's batch length."""
    calls: list[int] = []

    def decode(datas: list[Any], device: Any) -> list[Any]:
        calls.append(len(datas))
        return pillow_decode(datas, device)

    monkeypatch.setattr(nvjpeg, "nvjpeg_decode", decode)
    return calls


# -- the option ------------------------------------------------------------------------------------
class TestOption:
    def test_default_is_the_cpu_path(self) -> None:
        h = ImageHandler(SMALL)
        assert (h.decode, h.host_inputs, h.fixed_shapes, h.max_item_bytes) == ("cpu", False, True, 0)
        items = [h.preprocess(pb.Input(data=encode("JPEG"))) for _ in range(2)]
        assert isinstance(h.collate(items), torch.Tensor)

    @pytest.mark.parametrize("cls", [ImageHandler, ResNet50Handler])
    def test_gpu_keeps_inputs_on_the_host(self, cls: type[ImageHandler]) -> None:
        h = cls({"decode": "gpu"})
        assert (h.host_inputs, h.fixed_shapes, h.resize) == (True, False, "torch")
        assert type(h).fixed_shapes is True  # the instance's option, not the class's
        assert h.max_item_bytes == 1 << 20

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"decode": "foo"}, "handler option decode='foo': use cpu or gpu"),
            ({"decode": "GPU"}, "handler option decode='GPU': use cpu or gpu"),
            ({"decode": "gpu", "resize": "pil"}, "handler option resize='pil' does not go with decode=gpu"),
            ({"decode": "gpu", "max_bytes": "10"}, "handler option max_bytes=10 is outside [1024, "),
        ],
    )
    def test_bad_options_are_one_line(self, options: dict[str, str], message: str) -> None:
        with pytest.raises(ValueError) as err:
            ImageHandler(options)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)

    def test_start_up_check_passes_without_a_gpu(self) -> None:
        """The parent's handler check runs preprocess and collate only: no CUDA, no torchvision."""
        h = check_handler("image", {"decode": "gpu", "size": "32"})
        assert isinstance(h, ImageHandler) and h.host_inputs

    def test_check_device_needs_cuda(self) -> None:
        with pytest.raises(ValueError, match=r"decode=gpu needs --device cuda .*; this server runs on cpu"):
            ImageHandler({"decode": "gpu"}).check_device("cpu")
        ImageHandler().check_device("cpu")  # decode=cpu runs anywhere

    def test_check_device_needs_torchvision(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails, installed or not
        with pytest.raises(ValueError) as err:
            ImageHandler({"decode": "gpu"}).check_device("cuda")
        message = str(err.value)
        assert "torchvision does not import (ModuleNotFoundError" in message and "\n" not in message

    @pytest.mark.parametrize("workers", ["0", "2"])
    def test_serve_on_cpu_exits_with_one_line(self, workers: str) -> None:
        done = run_netgain(
            "serve", "--model", "image", "--handler-option", "decode=gpu", "--device", "cpu",
            "--port", "0", "--metrics-port", "-1", "--workers", workers, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("netgain serve: error: handler option decode=gpu needs --device cuda")
        assert "torchvision" in lines[0] and "nvJPEG" in lines[0]
        assert "listening" not in done.stdout and "grpc" not in done.stdout  # nothing was served


# -- pre-processing ------------------------------------------------------------------------------
class TestPreprocess:
    h = ImageHandler({**SMALL, "decode": "gpu"})

    def test_jpeg_bytes_go_through_as_they_came(self) -> None:
        data = synthetic_jpeg(random.Random(3), 20_000)
        t = self.h.preprocess(pb.Input(data=data))
        assert t.dim() == 1 and t.dtype == torch.uint8 and t.numpy().tobytes() == data
        t[0] = 0  # its own memory: writable, and the request's bytes are untouched
        assert data[0] == 0xFF

    def test_png_is_decoded_here_channel_first(self) -> None:
        data = encode("PNG")
        t = self.h.preprocess(pb.Input(data=data))
        assert t.shape == (3, 32, 32) and t.dtype == torch.uint8
        want = ImageHandler({**SMALL, "resize": "torch"}).preprocess(pb.Input(data=data))
        assert torch.equal(t, want)

    def test_cmyk_jpeg_is_decoded_here(self) -> None:
        """nvJPEG does not convert CMYK: such a JPEG takes the CPU path."""
        t = self.h.preprocess(pb.Input(data=encode("JPEG", mode="CMYK")))
        assert t.shape == (3, 32, 32)

    def test_grayscale_jpeg_goes_to_the_device(self) -> None:
        data = encode("JPEG", mode="L")
        assert self.h.preprocess(pb.Input(data=data)).numpy().tobytes() == data

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"", "image payload is empty"),
            (b"definitely not an image", "payload is not a decodable JPEG or PNG image"),
            (encode("GIF", mode="L"), "image format GIF is not accepted: send JPEG or PNG"),
            (encode("JPEG")[:30], "image header is truncated or corrupt"),
            (encode("PNG", (64, 64))[:80], "image is truncated or corrupt"),
        ],
    )
    def test_bad_headers_are_invalid_input(self, data: bytes, message: str) -> None:
        with pytest.raises(InvalidInput) as err:
            self.h.preprocess(pb.Input(data=data))
        assert message in str(err.value)

    def test_declared_pixels_are_checked_from_the_header(self) -> None:
        h = ImageHandler({**SMALL, "decode": "gpu", "max_pixels": "1000"})
        with pytest.raises(InvalidInput, match=r"declares 50x40 pixels, over the limit of 1000 \(handler"):
            h.preprocess(pb.Input(data=encode("JPEG")))

    def test_jpeg_over_max_bytes_is_invalid_input(self) -> None:
        data = synthetic_jpeg(random.Random(1), 20_000)
        h = ImageHandler({**SMALL, "decode": "gpu", "max_bytes": str(len(data) - 1)})
        with pytest.raises(InvalidInput) as err:
            h.preprocess(pb.Input(data=data))
        assert str(err.value) == (
            f"JPEG is {len(data)} bytes, over the limit of {len(data) - 1} with decode=gpu "
            "(handler option max_bytes)"
        )
        assert ImageHandler({**SMALL, "decode": "gpu", "max_bytes": str(len(data))}).preprocess(
            pb.Input(data=data)
        ).numel() == len(data)

    def test_a_broken_body_passes_the_header_check(self) -> None:
        assert self.h.preprocess(pb.Input(data=broken_body())).dim() == 1
        with pytest.raises(InvalidInput, match="image is truncated or corrupt"):  # the CPU path decodes
            ImageHandler(SMALL).preprocess(pb.Input(data=broken_body()))

    def test_collate_is_a_list_in_order(self) -> None:
        items = [self.h.preprocess(pb.Input(data=d)) for d in (encode("JPEG"), encode("PNG"))]
        batch = self.h.collate(items)
        assert isinstance(batch, list) and [x is y for x, y in zip(batch, items, strict=True)] == [True, True]


# -- hand-off slots (--workers) ---------------------------------------------------------------------
def test_slots_hold_the_largest_jpeg_and_png_pixels() -> None:
    h = ImageHandler({"decode": "gpu", "max_bytes": str(300_000)})
    slot_bytes, _, _ = measure_items(h, 0)
    assert slot_bytes >= ITEM_HEADER + 300_000
    ring = Ring(2, slot_bytes)
    biggest = torch.full((300_000,), 7, dtype=torch.uint8)
    ring.put(0, biggest)
    ring.put(1, h.preprocess(pb.Input(data=encode("PNG", (300, 200)))))
    assert torch.equal(ring.get(0), biggest) and ring.get(1).shape == (3, 224, 224)
    big_side = ImageHandler({"decode": "gpu", "size": "1024"})  # its PNG pixels outgrow 1 MiB
    assert measure_items(big_side, 0)[0] >= ITEM_HEADER + 3 * 1024 * 1024
    assert measure_items(ImageHandler(), 0)[0] < 1 << 20  # decode=cpu: sized from its items, as before


# -- decode and resize on the device (Pillow standing in for nvJPEG) ---------------------------------
def test_resize_matches_the_cpu_paths_uint8_kernel() -> None:
    img = torch.from_numpy(np.array(Image.open(io.BytesIO(encode("PNG", (70, 45))))))
    chw = img.permute(2, 0, 1).contiguous()
    got = nvjpeg.resize(chw.unsqueeze(0), 32)[0]
    want = torch.nn.functional.interpolate(
        img.permute(2, 0, 1).unsqueeze(0), (32, 32), mode="bilinear", antialias=True
    )[0]
    assert got.dtype == torch.uint8 and got.shape == (3, 32, 32)
    assert int((got.int() - want.int()).abs().max()) <= 1
    assert nvjpeg.resize(chw[:, :32, :32].unsqueeze(0), 32).data_ptr() == chw.data_ptr()  # already sized


def test_resize_reduces_a_very_long_side_in_two_steps() -> None:
    side = nvjpeg.MAX_STEP * 8 * 3
    x = torch.linspace(0, 255, side).round().to(torch.uint8).expand(1, 3, 16, side).contiguous()
    got = nvjpeg.resize(x, 8)
    direct = torch.nn.functional.interpolate(x.float(), (8, 8), mode="bilinear", antialias=True)
    assert got.shape == (1, 3, 8, 8) and float((got.float() - direct).abs().mean()) < 1.0


def test_forward_decodes_one_batch_and_fails_only_the_broken_item(fake_nvjpeg: list[int]) -> None:
    gpu, cpu = ImageHandler({**SMALL, "decode": "gpu"}), ImageHandler({**SMALL, "resize": "torch"})
    payloads = [
        encode("JPEG", seed=1),
        encode("PNG", seed=2),
        broken_body(),
        encode("JPEG", (80, 60), seed=4),
    ]
    model = gpu.build_model()
    with torch.inference_mode():
        good = gpu.forward(model, gpu.collate([gpu.preprocess(pb.Input(data=d)) for d in payloads[:2]]))
        assert isinstance(good, torch.Tensor) and fake_nvjpeg == [1]  # one JPEG, one call
        out = gpu.forward(model, gpu.collate([gpu.preprocess(pb.Input(data=d)) for d in payloads]))
        want = model(
            torch.stack([cpu.preprocess(pb.Input(data=d)) for d in (payloads[0], payloads[1], payloads[3])])
        )
    assert fake_nvjpeg == [1, 3, 1, 1, 1]  # the batch of three raised: then one by one
    assert isinstance(out, PartialOutput) and list(out.invalid) == [2] and out.output.shape == (4, 10)
    message = out.invalid[2]
    assert message.startswith("JPEG data is corrupt or not decodable by nvJPEG: ") and "\n" not in message
    assert "Error while decoding" not in message  # torchvision's wrapper is dropped
    # The other rows are those of the CPU path's pixels, in the batch's order (decoders agree here).
    assert torch.allclose(out.output[[0, 1, 3]], want, atol=0.05)
    assert torch.allclose(good, want[:2], atol=0.05)


def test_large_photos_resize_a_few_at_a_time(fake_nvjpeg: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    h = ImageHandler({**SMALL, "decode": "gpu"})
    batch = h.collate([h.preprocess(pb.Input(data=encode("JPEG", (60, 50), seed=i))) for i in range(5)])
    together, _ = nvjpeg.to_pixels(batch, 32, "cpu")
    monkeypatch.setattr(nvjpeg, "RESIZE_FLOATS", 2 * 3 * 60 * 50)  # two images per resize call
    resized: list[int] = []
    real = nvjpeg.resize
    monkeypatch.setattr(nvjpeg, "resize", lambda x, size: resized.append(len(x)) or real(x, size))
    apart, _ = nvjpeg.to_pixels(batch, 32, "cpu")
    assert resized == [2, 2, 1] and torch.equal(apart, together)


def test_out_of_memory_while_decoding_is_not_a_broken_item(monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(datas: list[Any], device: Any) -> list[Any]:
        raise RuntimeError("Error while decoding JPEG images: CUDA out of memory. Tried to allocate 2 GiB")

    monkeypatch.setattr(nvjpeg, "nvjpeg_decode", oom)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        nvjpeg.decode_all([torch.zeros(4, dtype=torch.uint8)], "cpu")


class _ListOom(Handler):
    """Host inputs; runs out of memory above ``fits`` items; an item of value 0 is invalid."""

    name = "list-oom"
    host_inputs = True

    def __init__(self, fits: int) -> None:
        super().__init__()
        self.fits = fits

    def forward(self, model: Any, batch: Any) -> Any:
        assert isinstance(batch, list)
        if len(batch) > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        out = torch.stack([x.float() for x in batch])
        invalid = {i: f"item {int(x)} is bad" for i, x in enumerate(batch) if int(x) == 0}
        return PartialOutput(out, invalid) if invalid else out


def test_runner_splits_a_list_batch_and_keeps_its_invalid_rows() -> None:
    runner = DeviceRunner(_ListOom(fits=2), "cpu")
    batch = [torch.tensor([v]) for v in (5, 0, 7, 0, 9)]
    assert runner.prepare(batch) is batch
    result = runner.run(batch)  # 5 → 2 + 3 → 2 + (1 + 2): the list cut, not each item
    assert result.output.view(-1).tolist() == [5, 0, 7, 0, 9] and result.splits == 2
    assert result.invalid == {1: "item 0 is bad", 3: "item 0 is bad"}  # the second half's rows offset
    with pytest.raises(DeviceOutOfMemory, match="single item"):
        DeviceRunner(_ListOom(fits=0), "cpu").run([torch.tensor([1])])


# -- the pipeline, in both layouts ------------------------------------------------------------------
class Collector:
    def __init__(self) -> None:
        self.done: dict[str, Pending] = {}
        self.cond = threading.Condition()

    def __call__(self, reqs: list[Pending]) -> None:
        with self.cond:
            self.done.update({p.request_id: p for p in reqs})
            self.cond.notify_all()

    def wait_for(self, n: int) -> dict[str, Pending]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.done) >= n, 10.0), f"only {len(self.done)} of {n}"
        return self.done


def _serve(handler: Handler, model: Any, requests: dict[str, list[Any]]) -> dict[str, Pending]:
    """One batch of ``requests`` through a pipeline on the CPU; each request as delivered."""
    q, out = RequestQueue(64), Collector()
    runner = DeviceRunner(handler, "cpu")
    runner.place(model)
    pipe = Pipeline(handler, [runner], q, PipelineConfig(16, 50.0, 1), out)
    now = time.perf_counter_ns()
    for rid, inputs in requests.items():
        q.put(Pending(rid, inputs, now))
    pipe.start()
    try:
        return out.wait_for(len(requests))
    finally:
        pipe.stop(5.0)


PAYLOADS = {
    "jpeg": [encode("JPEG", seed=1)],
    "broken": [broken_body()],
    "mixed": [encode("PNG"), encode("JPEG")],
}


def _labels_on_the_cpu_path() -> dict[str, list[int]]:
    cpu = ImageHandler({**SMALL, "resize": "torch"})
    model = cpu.build_model()
    with torch.inference_mode():
        return {
            rid: [int(model(cpu.preprocess(pb.Input(data=d)).unsqueeze(0)).argmax()) for d in items]
            for rid, items in PAYLOADS.items()
            if rid != "broken"
        }


def test_one_process_fails_only_the_broken_request(fake_nvjpeg: list[int]) -> None:
    handler = ImageHandler({**SMALL, "decode": "gpu"})
    requests = {rid: [pb.Input(data=d) for d in items] for rid, items in PAYLOADS.items()}
    done = _serve(handler, handler.build_model(), requests)
    assert (done["broken"].code, done["broken"].outputs) == ("INVALID_ARGUMENT", [])
    assert done["broken"].message.startswith("JPEG data is corrupt or not decodable by nvJPEG: ")
    assert done["jpeg"].code == done["mixed"].code == "OK"
    want = _labels_on_the_cpu_path()
    assert [o.label for o in done["jpeg"].outputs] == want["jpeg"]
    assert [o.label for o in done["mixed"].outputs] == want["mixed"]
    assert {p.batch_size for p in done.values()} == {4} and fake_nvjpeg[0] == 3  # one batch, one call
    assert all(p.spans["h2d"] == 0 for p in done.values())


def test_device_process_fails_only_the_broken_request(fake_nvjpeg: list[int]) -> None:
    """The --workers layout's device side: items read from the slots they were pre-processed into,
    the same pipeline, rows handed back raw (the frontend post-processes them)."""
    inner = ImageHandler({**SMALL, "decode": "gpu"})
    ring = Ring(8, measure_items(inner, 0)[0])
    slot = iter(range(8))
    requests: dict[str, list[Any]] = {}
    for rid, items in PAYLOADS.items():
        refs = []
        for d in items:
            s = next(slot)
            ring.put(s, inner.preprocess(pb.Input(data=d)))
            refs.append(SlotRef(0, s))
        requests[rid] = refs
    handler = SlotHandler(inner, [ring], staging=4, max_rows=16)
    assert handler.host_inputs and handler.staging == 0  # no stacking into pinned buffers
    done = _serve(handler, inner.build_model(), requests)  # the device process builds the inner's
    assert done["broken"].code == "INVALID_ARGUMENT"
    assert done["broken"].message.startswith("JPEG data is corrupt or not decodable by nvJPEG: ")
    want = _labels_on_the_cpu_path()
    for rid in ("jpeg", "mixed"):
        assert done[rid].code == "OK"
        assert [inner.postprocess(row).label for row in done[rid].outputs] == want[rid]
