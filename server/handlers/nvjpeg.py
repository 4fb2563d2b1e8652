"""JPEG decoding on the GPU for the image handlers' ``decode=gpu``: nvJPEG through torchvision's
``decode_jpeg`` (a list of CPU byte tensors decodes as one batch), then torch's antialiased
bilinear resize on the device.

torchvision is imported only here, when a batch is decoded or the server checks the option at
start-up: the CPU path, the load generator and the tests without a GPU never need it.
"""

from __future__ import annotations

import re
from typing import Any

MIN_TORCHVISION = (0, 19)  # decode_jpeg takes a list (one batched nvJPEG call) from 0.19
NEEDS = "handler option decode=gpu needs --device cuda and torchvision >= 0.19 built with CUDA (nvJPEG)"
# The CUDA antialiased resize keeps a side's filter weights in shared memory, which a reduction of
# about 200 times (float32, 224 px) overflows: a larger one goes in two steps of at most this each.
MAX_STEP = 64
_PREFIX = "Error while decoding JPEG images: "  # torchvision's wrapper around nvJPEG's own message
RESIZE_FLOATS = 1 << 26  # floats one resize call may take (256 MB): large photos go a few at a time


def check(device: str) -> None:
    """ValueError (one line) unless JPEGs can be decoded on ``device`` with nvJPEG. Imports
    torchvision, which does not initialise CUDA (safe before the --workers processes fork)."""
    if not device.startswith("cuda"):
        raise ValueError(f"{NEEDS}; this server runs on {device}")
    try:
        import torchvision
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # not installed, or built for another torch
        raise ValueError(
            f"{NEEDS}: torchvision does not import ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    version = str(torchvision.__version__)
    if tuple(int(n) for n in re.findall(r"\d+", version)[:2]) < MIN_TORCHVISION:
        raise ValueError(f"{NEEDS}: torchvision {version} is installed")
    if not getattr(torchvision.version, "cuda", None):
        raise ValueError(f"{NEEDS}: torchvision {version} is a CPU build")


def first_line(exc: BaseException) -> str:
    """An exception's message in one line (torch's C++ errors append a stack trace)."""
    text = str(exc).strip().splitlines()
    return text[0].removeprefix(_PREFIX) if text else type(exc).__name__


def nvjpeg_decode(datas: list[Any], device: Any) -> list[Any]:
    """RGB uint8 channel-first images on ``device`` for 1-D uint8 CPU tensors of JPEG bytes."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))


def decode_all(datas: list[Any], device: Any) -> list[Any]:
    """Each JPEG decoded on ``device``: in one batched call, or when that raises, one by one, a
    broken item's entry being its one-line message. Running out of device memory is raised as
    torch.OutOfMemoryError (the server splits the batch), never taken for a broken item."""
    if not datas:
        return []
    try:
        return nvjpeg_decode(datas, device)
    except (RuntimeError, ValueError) as exc:
        _raise_oom(exc)
    out: list[Any] = []
    for data in datas:
        try:
            out.append(nvjpeg_decode([data], device)[0])
        except (RuntimeError, ValueError) as exc:
            _raise_oom(exc)
            out.append(f"JPEG data is corrupt or not decodable by nvJPEG: {first_line(exc)}")
    return out


def _raise_oom(exc: BaseException) -> None:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        raise exc
    if "out of memory" in str(exc).lower():  # torchvision rewraps the allocator's error
        raise torch.OutOfMemoryError(first_line(exc)) from None


def resize(images: Any, size: int) -> Any:
    """uint8 images ``[n, 3, h, w]`` on the device → ``[n, 3, size, size]`` uint8, antialiased
    bilinear as the CPU path's ``resize=torch`` (the CUDA kernel takes floats, not uint8)."""
    import torch
    from torch.nn.functional import interpolate

    height, width = images.shape[-2:]
    if (height, width) == (size, size):
        return images
    x = images.float()
    if max(height, width) > MAX_STEP * size:
        step = (min(height, MAX_STEP * size), min(width, MAX_STEP * size))
        x = interpolate(x, step, mode="bilinear", antialias=True)
    x = interpolate(x, (size, size), mode="bilinear", antialias=True)
    return x.round_().clamp_(0, 255).to(torch.uint8)


def to_pixels(batch: list[Any], size: int, device: Any) -> tuple[Any, dict[int, str]]:
    """The model's input for a ``decode=gpu`` batch: 1-D items are JPEG bytes, decoded together on
    the device and resized; others are CPU-decoded pixels ``[3, size, size]`` (PNG), copied. Returns
    ``[n, 3, size, size]`` uint8 in the batch's order and the rows that failed to decode (zeros)."""
    import torch

    jpegs = [i for i, x in enumerate(batch) if x.dim() == 1]
    decoded = dict(zip(jpegs, decode_all([batch[i] for i in jpegs], device), strict=True))
    rows: list[Any] = [None] * len(batch)
    invalid = {i: img for i, img in decoded.items() if isinstance(img, str)}
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, img in decoded.items():
        if i not in invalid:
            by_shape.setdefault(tuple(img.shape), []).append(i)
    for shape, same in by_shape.items():  # images of one shape resize together
        per = max(1, RESIZE_FLOATS // (shape[0] * shape[1] * shape[2]))
        for at in range(0, len(same), per):
            chunk = same[at : at + per]
            out = resize(torch.stack([decoded[i] for i in chunk]), size)
            for j, i in enumerate(chunk):
                rows[i] = out[j]
    for i, x in enumerate(batch):
        if i in invalid:
            rows[i] = torch.zeros((3, size, size), dtype=torch.uint8, device=device)
        elif rows[i] is None:
            rows[i] = x.to(device)
    return torch.stack(rows), invalid
