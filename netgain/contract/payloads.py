"""Request payloads of the built-in models, deterministic per ``random.Random``: one implementation
for the server's handlers (``example_input``, warm-up) and the load generator.

Pillow, numpy and the standard library only: a load-generator host needs neither torch nor
tokenizers. A payload is the fields of one ``netgain.v1.Input``: ``{"data": bytes}`` or
``{"features": [float, ...]}``.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

#: Common English words (and a few of this project's): the text payloads, and the text model's
#: vocabulary.
WORDS = tuple(
    """the of and to in is was for on that with as by at from his her it an be this are which or had
    not but were have one they their all been has more when who will would there she into other out
    also time first new some can only after him two these may over its most then years such about
    state made no used people than where up between many city world during both through year later
    well under while part being three film since school known each war government national
    area de team season could day like because series number back life before what four
    company called name states united work same including then second group several high music
    family house based around own north however south league found early did university
    system any against another game members place public much even use include won though
    model server request latency batch queue device memory copy kernel cost traffic load
    service cluster node graph image text token vector score label class layer tensor""".split()
)

DEFAULT_IMAGE_BYTES = 20_000  # about a 224x224 photo
DEFAULT_TEXT_BYTES = 400  # about 80 tokens
DEFAULT_NULL_BYTES = 64
DEFAULT_FEATURES = 64


def int_option(options: Mapping[str, str], key: str, default: int, lo: int = 1, hi: int = 1 << 30) -> int:
    """An integer handler option (``--handler-option key=value``), ``default`` when absent; ValueError
    naming the option when it is not an integer in ``[lo, hi]``."""
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"handler option {key}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"handler option {key}={value} is outside [{lo}, {hi}]")
    return value


def synthetic_jpeg(rng: random.Random, target_bytes: int) -> bytes:
    """A deterministic photo-like JPEG close to ``target_bytes`` (smooth gradients plus noise)."""
    import numpy as np
    from PIL import Image

    seed = rng.getrandbits(32)
    side = max(16, int((target_bytes / 0.45) ** 0.5))
    data = b""
    for _ in range(3):
        gen = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
        base = np.stack([xx, yy, (xx + yy) / 2], axis=-1) * 200.0
        noise = gen.normal(0.0, 25.0, size=(side, side, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=85)
        data = buf.getvalue()
        ratio = target_bytes / max(1, len(data))
        if 0.9 <= ratio <= 1.1:
            break
        side = max(16, int(side * ratio**0.5))
    return data


def text_bytes(rng: random.Random, size: int | None = None) -> bytes:
    """UTF-8 text of words from WORDS, ``size`` bytes (default 400)."""
    target = size or DEFAULT_TEXT_BYTES
    words: list[str] = []
    length = 0
    while length < target:
        w = rng.choice(WORDS)
        words.append(w)
        length += len(w) + 1
    return " ".join(words)[:target].encode()


def tabular_features(rng: random.Random, features: int) -> list[float]:
    """``features`` values in (-1, 1): tanh of standard normals."""
    return [math.tanh(rng.gauss(0.0, 1.0)) for _ in range(features)]


def null_bytes(rng: random.Random, size: int | None = None) -> bytes:
    """``size`` random bytes (default 64)."""
    return rng.randbytes(size if size is not None else DEFAULT_NULL_BYTES)


def _image(options: Mapping[str, str]) -> Callable[[random.Random, int | None], dict[str, Any]]:
    return lambda rng, size: {"data": synthetic_jpeg(rng, size or DEFAULT_IMAGE_BYTES)}


def _text(options: Mapping[str, str]) -> Callable[[random.Random, int | None], dict[str, Any]]:
    return lambda rng, size: {"data": text_bytes(rng, size)}


def _tabular(options: Mapping[str, str]) -> Callable[[random.Random, int | None], dict[str, Any]]:
    features = int_option(options, "features", DEFAULT_FEATURES, hi=1 << 16)
    return lambda rng, size: {"features": tabular_features(rng, features)}


def _null(options: Mapping[str, str]) -> Callable[[random.Random, int | None], dict[str, Any]]:
    return lambda rng, size: {"data": null_bytes(rng, size)}


#: The built-in models, each to the maker of its payloads for given handler options.
BUILTIN: dict[str, Callable[[Mapping[str, str]], Callable[[random.Random, int | None], dict[str, Any]]]] = {
    "image": _image,
    "null": _null,
    "tabular": _tabular,
    "text": _text,
    # the reference models at real size take the same payloads as image and text
    "resnet50": _image,
    "bert-base": _text,
}


def builtin_payloads(
    model: str, options: Mapping[str, str] | None = None
) -> Callable[[random.Random, int | None], dict[str, Any]]:
    """``(rng, size) -> Input fields`` for a built-in model and its handler options: the same
    payloads as its handler's ``example_input``. KeyError for a model that is not built in;
    ValueError for an option the payloads depend on that is invalid."""
    return BUILTIN[model](options or {})
