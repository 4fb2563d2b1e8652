"""Property-based fuzzing of every built-in handler's payload decoding, in process.

The property: ``handler.preprocess(item)`` either returns a tensor of the shape the model
expects or raises ``InvalidInput`` with a non-empty message — never any other exception
(which the server would turn into INTERNAL) and never a hang or a huge allocation. The
request-level checks that need no handler (``validate_request``, the request-id pattern)
are fuzzed the same way. Thousands of cases in a few seconds.
"""

from __future__ import annotations

import math
import time
from typing import Any

import grpc
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_helpers import encoded_image, jpeg_with_declared_size, png_bomb

from netgain.protos import pb
from netgain.server.handlers.base import Handler, InvalidInput
from netgain.server.handlers.image import ImageHandler
from netgain.server.handlers.null import NullHandler
from netgain.server.handlers.tabular import TabularHandler
from netgain.server.handlers.text import TextHandler
from netgain.server.service import REQUEST_ID_RE, Limits, validate_request

FAST = settings(deadline=None, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
IMAGE_SIZE = 32
FEATURES = 16
MAX_LEN = 16
# Cases tried by each property below (docs/reliability.md quotes the sum).
N_IMAGE, N_TEXT, N_TABULAR, N_NULL, N_REQUEST, N_IDS = 1500, 1500, 1500, 500, 1000, 1000

IMAGE = ImageHandler({"size": str(IMAGE_SIZE), "max_pixels": "1000000"})
TEXT = TextHandler({"max_len": str(MAX_LEN), "layers": "1", "d_model": "32", "heads": "2"})
TABULAR = TabularHandler({"features": str(FEATURES)})
NULL = NullHandler()
SEEDS = [
    encoded_image("JPEG", 40, 1),
    encoded_image("PNG", 40, 2),
    encoded_image("JPEG", 24, 3),
    encoded_image("PNG", 8, 4),
]


def outcome(handler: Handler, item: pb.Input) -> Any:
    """preprocess's result, or the InvalidInput it raised; anything else fails the test."""
    try:
        return handler.preprocess(item)
    except InvalidInput as exc:
        assert str(exc).strip(), "InvalidInput without a message"
        return exc


# -- image -----------------------------------------------------------------------------------
@st.composite
def image_payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "truncated", "mutated", "prefix+garbage", "bomb"]))
    seed = draw(st.sampled_from(SEEDS))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    if kind == "truncated":
        return seed[: draw(st.integers(0, len(seed)))]
    if kind == "mutated":
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 16))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "prefix+garbage":
        return seed[: draw(st.integers(0, 64))] + draw(st.binary(max_size=512))
    w, h = draw(st.integers(1, 1 << 20)), draw(st.integers(1, 1 << 20))
    return png_bomb(w, h) if draw(st.booleans()) else jpeg_with_declared_size(min(w, 65535), min(h, 65535))


@pytest.mark.slow
@settings(FAST, max_examples=N_IMAGE)
@given(image_payloads())
def test_image_preprocess_returns_pixels_or_invalid_input(data: bytes) -> None:
    t0 = time.perf_counter()
    out = outcome(IMAGE, pb.Input(data=data))
    if not isinstance(out, InvalidInput):
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == (IMAGE_SIZE, IMAGE_SIZE, 3)
        assert out.dtype == torch.uint8
    assert time.perf_counter() - t0 < 5.0  # no payload decodes for long


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (png_bomb(100_000, 100_000), "pixels"),  # 10^10 pixels declared in 100 bytes
        (png_bomb(2000, 2000), "max_pixels"),  # over the handler's max_pixels, under PIL's own limit
        (png_bomb(8000, 8000, real_rows=8000), "pixels"),  # a real bomb: ~64 KB inflating to 64 MB
        (jpeg_with_declared_size(65_000, 65_000), "pixels"),
        (jpeg_with_declared_size(1100, 1000), "max_pixels"),
    ],
)
def test_decompression_bombs_are_rejected_before_decoding(payload: bytes, words: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(InvalidInput, match=words):
        IMAGE.preprocess(pb.Input(data=payload))
    assert time.perf_counter() - t0 < 1.0, "the bomb was decoded"
    assert len(payload) < 200_000


def test_image_max_pixels_option_is_the_limit() -> None:
    small = ImageHandler({"size": "8", "max_pixels": "1600"})
    assert small.preprocess(pb.Input(data=encoded_image("PNG", 40))).shape == (8, 8, 3)  # 1600 pixels
    with pytest.raises(InvalidInput, match=r"41x41 pixels, over the limit of 1600"):
        small.preprocess(pb.Input(data=encoded_image("PNG", 41)))


# -- text ------------------------------------------------------------------------------------
@st.composite
def text_payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "unicode", "invalid-utf8", "whitespace", "long"]))
    if kind == "bytes":
        return draw(st.binary(max_size=1024))
    if kind == "unicode":
        return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass")
    if kind == "invalid-utf8":
        good = draw(st.text(max_size=50)).encode("utf-8", "surrogatepass")
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
        return good + bad + draw(st.binary(max_size=20))
    if kind == "whitespace":
        return draw(st.text(alphabet=" \t\r\n\x0b\x0c\u00a0\u2003", max_size=40)).encode()
    return draw(st.text(alphabet="ab ", min_size=1, max_size=20)).encode() * draw(st.integers(1, 5000))


@pytest.mark.slow
@settings(FAST, max_examples=N_TEXT)
@given(text_payloads())
def test_text_preprocess_returns_ids_or_invalid_input(data: bytes) -> None:
    out = outcome(TEXT, pb.Input(data=data))
    try:
        # Something must be left after the tokenizer's normalisation (NUL, control and zero-width
        # characters are removed) of the characters it is given (the first max_chars).
        text = data.decode("utf-8")[: TEXT.max_chars]
        valid = bool(TEXT.tokenizer.normalizer.normalize_str(text).strip())
    except UnicodeDecodeError:
        valid = False
    if valid:
        assert isinstance(out, torch.Tensor), out
        assert out.dtype == torch.long and 1 <= out.shape[0] <= MAX_LEN
        assert int(out.max()) < TEXT.vocab_size
    else:
        assert isinstance(out, InvalidInput)


def test_text_messages_name_the_problem() -> None:
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        TEXT.preprocess(pb.Input(data=b"caf\xe9"))
    with pytest.raises(InvalidInput, match="empty"):
        TEXT.preprocess(pb.Input(data=b" \n\t"))


# -- tabular ---------------------------------------------------------------------------------
special = st.sampled_from([math.nan, math.inf, -math.inf])
floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def feature_vectors(draw: st.DrawFn) -> list[float]:
    n = draw(st.one_of(st.just(FEATURES), st.integers(0, 3 * FEATURES)))
    values = draw(st.lists(floats32, min_size=n, max_size=n))
    spoil = draw(st.booleans())
    if values and spoil:
        values[draw(st.integers(0, n - 1))] = draw(special)
    return values


@pytest.mark.slow
@settings(FAST, max_examples=N_TABULAR)
@given(feature_vectors())
def test_tabular_preprocess_checks_count_and_finiteness(values: list[float]) -> None:
    out = outcome(TABULAR, pb.Input(features=values))
    usable = all(math.isfinite(v) and abs(v) <= TABULAR.max_abs for v in values)
    if len(values) == FEATURES and usable:
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == (FEATURES,)
    else:
        assert isinstance(out, InvalidInput)
        assert ("features" in str(out)) or ("finite" in str(out))


# -- null ------------------------------------------------------------------------------------
@settings(FAST, max_examples=N_NULL)
@given(st.binary(max_size=4096), st.lists(st.floats(width=32), max_size=64))
def test_null_accepts_anything(data: bytes, features: list[float]) -> None:
    assert NULL.preprocess(pb.Input(data=data, features=features)) == len(data) + len(features)


# -- request-level checks (no handler) -------------------------------------------------------
LIMITS = Limits(max_items=8, max_message_bytes=1 << 20)


@pytest.mark.slow
@settings(FAST, max_examples=N_REQUEST)
@given(
    model=st.one_of(st.just(""), st.just("image"), st.text(max_size=40)),
    inputs=st.lists(
        st.builds(pb.Input, data=st.binary(max_size=8), features=st.lists(st.floats(width=32), max_size=2)),
        max_size=12,
    ),
)
def test_validate_request_answers_every_shape(model: str, inputs: list[pb.Input]) -> None:
    req = pb.InferRequest(model=model, inputs=inputs)
    got = validate_request(req, "image", LIMITS)
    if model not in ("", "image"):
        assert got is not None and got[0] == grpc.StatusCode.NOT_FOUND and "image" in got[1]
    elif not inputs or len(inputs) > LIMITS.max_items or any(not i.data and not i.features for i in inputs):
        assert got is not None and got[0] == grpc.StatusCode.INVALID_ARGUMENT and got[1]
    else:
        assert got is None


ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"


@settings(FAST, max_examples=N_IDS)
@given(st.one_of(st.text(alphabet=ID_CHARS, max_size=200), st.text(max_size=200)))
@example("abc\n")  # found by this test: "$" in the pattern let a trailing newline through
@example("a" * 128)
@example("a" * 129)
def test_request_id_pattern_is_length_and_charset(rid: str) -> None:
    expected = 1 <= len(rid) <= 128 and all(c in ID_CHARS for c in rid)
    assert bool(REQUEST_ID_RE.match(rid)) is expected


def test_fuzz_case_counts_for_the_docs() -> None:
    assert N_IMAGE + N_TEXT + N_TABULAR + N_NULL + N_REQUEST + N_IDS == 7000
