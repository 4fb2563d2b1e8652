"""Image classifier: encoded JPEG/PNG → decode and resize on the CPU → 8-conv CNN.

Pre-processing hands the device uint8 pixels (4x fewer bytes to copy than float32): height x
width x channel as Pillow resizes them (no transposing copy on the CPU), or channel first as
torch's resize writes them (``resize=torch``); the model moves channels first where needed,
scales and normalises on the device. With ``decode=gpu`` the CPU only checks the header and a
JPEG's bytes go to the device as they came, decoded there in batches (``nvjpeg.py``).
"""

from __future__ import annotations

import io
import random
import struct
import warnings
from typing import Any

from netgain.contract.payloads import DEFAULT_IMAGE_BYTES, synthetic_jpeg
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers.base import Handler, InvalidInput, PartialOutput, argmax_output

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
_CHANNELS = (32, 32, 64, 64, 128, 128, 256, 256)
# What Pillow raises on corrupt or truncated data (found by tests/test_reliability_fuzz_handlers.py).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)


class ImageHandler(Handler):
    """Options: ``size`` (input side, default 224), ``classes`` (1000),
    ``max_pixels`` (decoded pixel limit against decompression bombs, default 40,000,000),
    ``resize`` (``pil``, the default, or ``torch``: the same antialiased bilinear resize by torch's
    uint8 kernel, which costs a fraction of Pillow's on one thread; docs/benchmarks.md),
    ``decode`` (``cpu``, the default, or ``gpu``: JPEGs decoded by nvJPEG and resized by torch on
    the device; PNGs still on the CPU; needs --device cuda and torchvision), ``max_bytes`` (with
    ``decode=gpu``, the largest JPEG accepted, default 1 MiB: the --workers hand-off slots hold it)."""

    name = "image"
    fixed_shapes = True

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.size = self.int_option("size", 224, lo=8, hi=4096)
        self.classes = self.int_option("classes", 1000, hi=1 << 16)
        self.max_pixels = self.int_option("max_pixels", 40_000_000)
        self.decode = self.options.get("decode", "cpu")
        if self.decode not in ("cpu", "gpu"):
            raise ValueError(f"handler option decode={self.decode!r}: use cpu or gpu")
        gpu = self.decode == "gpu"
        self.resize = self.options.get("resize", "torch" if gpu else "pil")
        if self.resize not in ("pil", "torch"):
            raise ValueError(f"handler option resize={self.resize!r}: use pil or torch")
        if gpu and self.resize != "torch":
            raise ValueError(
                "handler option resize='pil' does not go with decode=gpu (torch resizes on the device)"
            )
        self.max_bytes = self.int_option("max_bytes", 1 << 20, lo=1024, hi=1 << 26)
        if gpu:
            # JPEG bytes of any length (PNG pixels beside them) cross to the device as a list.
            self.host_inputs = True
            self.fixed_shapes = False
            self.max_item_bytes = max(self.max_bytes, 3 * self.size * self.size)

    def check_device(self, device: str) -> None:
        if self.decode == "gpu":
            from netgain.server.handlers import nvjpeg

            nvjpeg.check(device)

    def build_model(self) -> Any:
        import torch
        from torch import nn

        class CNN(nn.Module):
            def __init__(self, classes: int) -> None:
                super().__init__()
                self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255.0)
                self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255.0)
                layers: list[nn.Module] = []
                width = 3
                for i, ch in enumerate(_CHANNELS):
                    stride = 2 if i % 2 == 0 else 1
                    layers += [nn.Conv2d(width, ch, 3, stride, 1, bias=False), nn.BatchNorm2d(ch), nn.ReLU()]
                    width = ch
                self.features = nn.Sequential(*layers)
                self.head = nn.Linear(width, classes)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                mean: torch.Tensor = self.mean  # type: ignore[assignment]
                std: torch.Tensor = self.std  # type: ignore[assignment]
                if x.shape[1] != 3:  # channels last (the side is at least 8): channels first
                    x = x.permute(0, 3, 1, 2)
                x = ((x.to(mean.dtype) - mean) / std).contiguous()
                x = self.features(x)
                return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return CNN(self.classes).eval()

    def preprocess(self, item: pb.Input) -> Any:
        img = self._open(item.data)
        # nvJPEG decodes YCbCr and grayscale JPEGs; CMYK ones and PNGs are decoded here.
        if self.decode == "gpu" and img.format == "JPEG" and img.mode in ("RGB", "L"):
            import torch

            if len(item.data) > self.max_bytes:
                raise InvalidInput(
                    f"JPEG is {len(item.data)} bytes, over the limit of {self.max_bytes} with decode=gpu "
                    "(handler option max_bytes)"
                )
            # Its own copy of the bytes: the request's buffer is not the tensor's to keep.
            return torch.frombuffer(bytearray(item.data), dtype=torch.uint8)
        return self._pixels(img)

    def _open(self, data: bytes) -> Any:
        """The image, its header read and checked (format, declared pixels); nothing decoded yet."""
        from PIL import Image, UnidentifiedImageError

        if not data:
            raise InvalidInput("image payload is empty: send JPEG or PNG bytes in Input.data")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(data))
        except UnidentifiedImageError:
            raise InvalidInput("payload is not a decodable JPEG or PNG image") from None
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
            raise InvalidInput(f"image declares too many pixels (decompression bomb): {exc}") from None
        except _DECODE_ERRORS as exc:  # e.g. a header cut short: "Truncated File Read"
            raise InvalidInput(f"image header is truncated or corrupt: {exc}") from None
        if img.format not in ("JPEG", "PNG"):
            raise InvalidInput(f"image format {img.format} is not accepted: send JPEG or PNG")
        width, height = img.size
        if width * height > self.max_pixels:
            raise InvalidInput(
                f"image declares {width}x{height} pixels, over the limit of {self.max_pixels} "
                "(handler option max_pixels)"
            )
        return img

    def _pixels(self, img: Any) -> Any:
        """Decoded and resized on the CPU: ``size`` x ``size`` x 3 (Pillow) or 3 x ``size`` x ``size``
        (``resize=torch``), uint8."""
        import numpy as np
        import torch
        from PIL import Image

        try:
            if img.format == "JPEG":
                img.draft("RGB", (self.size, self.size))
            rgb = img.convert("RGB")
            if self.resize == "pil":
                rgb = rgb.resize((self.size, self.size), Image.Resampling.BILINEAR)
        except _DECODE_ERRORS as exc:
            raise InvalidInput(f"image is truncated or corrupt: {exc}") from None
        pixels = torch.from_numpy(np.array(rgb, dtype=np.uint8))  # H x W x 3
        if self.resize == "pil":
            return pixels
        # Channels-last uint8 in, channels-first out: torch's vectorised path, no extra copy.
        out = torch.nn.functional.interpolate(
            pixels.permute(2, 0, 1).unsqueeze(0), (self.size, self.size), mode="bilinear", antialias=True
        )
        return out[0]

    def forward(self, model: Any, batch: Any) -> Any:
        if not self.host_inputs:
            return model(batch)
        from netgain.server.handlers import nvjpeg

        device = next(model.parameters()).device
        pixels, invalid = nvjpeg.to_pixels(batch, self.size, device)
        out = model(pixels)
        return PartialOutput(out, invalid) if invalid else out

    def postprocess(self, row: Any) -> pb.Output:
        return argmax_output(row)

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        """A JPEG of roughly ``size`` bytes (default: a 224x224 photo-like image)."""
        return pb.Input(data=synthetic_jpeg(rng, size or DEFAULT_IMAGE_BYTES))
