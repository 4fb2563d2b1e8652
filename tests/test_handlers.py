"""Built-in handlers and the module:Class loader, in process (no server)."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
import torch
from PIL import Image

from netgain.protos import pb
from netgain.server.handlers import BUILTIN, create_handler, resolve_handler_class
from netgain.server.handlers.base import Handler, InvalidInput
from netgain.server.handlers.image import ImageHandler
from netgain.server.handlers.null import NullHandler
from netgain.server.handlers.tabular import TabularHandler
from netgain.server.handlers.text import TextHandler

SMALL_TEXT = {"layers": "1", "d_model": "32", "heads": "2", "max_len": "16"}


def encode(fmt: str, size: tuple[int, int] = (20, 12), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color=(10, 200, 30) if mode == "RGB" else 128).save(buf, format=fmt)
    return buf.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose IHDR is patched (with a valid CRC) to declare width x height."""
    data = bytearray(encode("PNG", (1, 1)))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


# -- loader ----------------------------------------------------------------------------------------
class TestLoader:
    def test_builtins_and_module_class(self) -> None:
        assert set(BUILTIN) == {"image", "text", "tabular", "null", "resnet50", "bert-base"}
        assert resolve_handler_class("image") is ImageHandler
        assert resolve_handler_class("netgain.server.handlers.null:NullHandler") is NullHandler
        h = create_handler("tabular", {"features": "4"}, seed=3)
        assert isinstance(h, TabularHandler) and h.features == 4 and h.seed == 3

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "resnet",
                "unknown model 'resnet': use one of bert-base, image, null, resnet50, tabular, text "
                "or module:Class",
            ),
            ("no_such_module_xyz:Model", "cannot import handler module 'no_such_module_xyz'"),
            (
                "collections:OrderedDict",
                "'collections:OrderedDict' is not a subclass of netgain.server.handlers.Handler",
            ),
            ("netgain.server.handlers.null:Missing", "has no class 'Missing'"),
            ("netgain.server.handlers.base:argmax_output", "is not a subclass"),
        ],
    )
    def test_bad_specs(self, spec: str, message: str) -> None:
        with pytest.raises(ValueError) as err:
            resolve_handler_class(spec)
        assert message in str(err.value)

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"size": "big"}, "handler option size='big' is not an integer"),
            ({"size": "4"}, "handler option size=4 is outside [8, 4096]"),
        ],
    )
    def test_bad_int_options(self, options: dict[str, str], message: str) -> None:
        with pytest.raises(ValueError) as err:
            ImageHandler(options)
        assert message in str(err.value)

    def test_text_option_errors(self) -> None:
        with pytest.raises(ValueError, match="pad='ragged': use longest or fixed"):
            TextHandler({"pad": "ragged"})
        with pytest.raises(ValueError, match="d_model=30 is not divisible by heads=4"):
            TextHandler({"d_model": "30", "heads": "4"})

    @pytest.mark.parametrize("spec", ["image", "text", "tabular", "null"])
    def test_example_input_is_accepted_by_its_handler(self, spec: str) -> None:
        options = {"size": "32"} if spec == "image" else SMALL_TEXT if spec == "text" else {}
        h = create_handler(spec, options)
        rng = random.Random(0)
        items = [h.preprocess(h.example_input(rng)) for _ in range(3)]
        assert h.collate(items) is not None


# -- image --------------------------------------------------------------------------------------------------
class TestImage:
    h = ImageHandler({"size": "32"})

    @pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
    def test_decodes_and_resizes(self, fmt: str) -> None:
        t = self.h.preprocess(pb.Input(data=encode(fmt, (50, 20))))
        assert t.shape == (32, 32, 3) and t.dtype == torch.uint8
        assert abs(int(t[..., 1].float().mean()) - 200) < 8  # the green channel survived decoding

    @pytest.mark.parametrize("side", [150, 640])  # upscale to 224, and downscale after the JPEG draft
    def test_torch_resize_matches_pillow_and_the_model_reads_either_layout(self, side: int) -> None:
        from netgain.contract.payloads import synthetic_jpeg

        pil, fast = ImageHandler(), ImageHandler({"resize": "torch"})
        rng = random.Random(side)
        items = [pb.Input(data=synthetic_jpeg(rng, int(side * side * 0.45))) for _ in range(2)]
        a = torch.stack([pil.preprocess(x) for x in items])
        b = torch.stack([fast.preprocess(x) for x in items])
        assert a.shape == (2, 224, 224, 3) and b.shape == (2, 3, 224, 224) and b.is_contiguous()
        diff = (a.permute(0, 3, 1, 2).int() - b.int()).abs()
        worst, mean = int(diff.max()), float(diff.float().mean())
        assert worst <= 1 and mean < 0.05, (worst, mean)
        model = pil.build_model()
        with torch.inference_mode():
            same = model(a.permute(0, 3, 1, 2).contiguous())  # channels first, as torch resizes them
            assert torch.allclose(model(a), same, atol=1e-5)

    def test_resize_option_is_checked(self) -> None:
        with pytest.raises(ValueError, match="handler option resize='cv2': use pil or torch"):
            ImageHandler({"resize": "cv2"})

    def test_grayscale_png_becomes_rgb(self) -> None:
        assert self.h.preprocess(pb.Input(data=encode("PNG", mode="L"))).shape == (32, 32, 3)

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"", "image payload is empty"),
            (b"definitely not an image", "payload is not a decodable JPEG or PNG image"),
            (encode("GIF", mode="L"), "image format GIF is not accepted: send JPEG or PNG"),
            (encode("PNG", (64, 64))[:80], "image is truncated or corrupt"),
        ],
    )
    def test_bad_payloads(self, data: bytes, message: str) -> None:
        with pytest.raises(InvalidInput) as err:
            self.h.preprocess(pb.Input(data=data))
        assert message in str(err.value)

    def test_features_instead_of_bytes_is_empty_image(self) -> None:
        with pytest.raises(InvalidInput, match="image payload is empty"):
            self.h.preprocess(pb.Input(features=[1.0, 2.0]))

    def test_max_pixels_option(self) -> None:
        h = ImageHandler({"size": "32", "max_pixels": "100"})
        with pytest.raises(
            InvalidInput, match=r"declares 20x12 pixels, over the limit of 100 \(handler option"
        ):
            h.preprocess(pb.Input(data=encode("PNG", (20, 12))))
        assert h.preprocess(pb.Input(data=encode("PNG", (10, 10)))).shape == (32, 32, 3)

    def test_decompression_bomb_header_rejected_without_decoding(self) -> None:
        # 8000x8000 = 64 Mpx: below PIL's own bomb limit, above the handler's 40 Mpx default.
        with pytest.raises(InvalidInput, match="declares 8000x8000 pixels, over the limit of 40000000"):
            self.h.preprocess(pb.Input(data=png_declaring(8000, 8000)))

    def test_huge_declared_size_is_invalid_input(self) -> None:
        # 100000x100000: PIL refuses it at open (DecompressionBombError); still a clean InvalidInput.
        with pytest.raises(InvalidInput) as err:
            self.h.preprocess(pb.Input(data=png_declaring(100_000, 100_000)))
        assert "pixels" in str(err.value)

    def test_model_forward_shape_and_determinism(self) -> None:
        h = ImageHandler({"size": "32", "classes": "10"})
        batch = h.collate([h.preprocess(pb.Input(data=encode("PNG")))] * 2)
        with torch.inference_mode():
            a = h.forward(h.build_model(), batch)
            b = h.forward(ImageHandler({"size": "32", "classes": "10"}).build_model(), batch)
        assert a.shape == (2, 10)
        assert torch.equal(a, b)
        out = h.postprocess(a[0])
        assert 0 <= out.label < 10 and 0.0 < out.score <= 1.0


# -- text ------------------------------------------------------------------------------------------------
class TestText:
    h = TextHandler(SMALL_TEXT)

    def test_tokenizes_with_cls_and_sep(self) -> None:
        ids = self.h.preprocess(pb.Input(data=b"The model serves a batch"))
        vocab = self.h.tokenizer.get_vocab()
        assert ids.dtype == torch.long and ids.dim() == 1
        assert int(ids[0]) == vocab["[CLS]"] and int(ids[-1]) == vocab["[SEP]"]
        assert vocab["model"] in ids.tolist() and vocab["[UNK]"] not in ids.tolist()

    def test_long_text_truncated_to_max_len(self) -> None:
        assert self.h.preprocess(pb.Input(data=b"word " * 500)).shape[0] == 16

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"caf\xe9 latte", "text is not valid UTF-8 (byte 3:"),
            (b"\xff\xfe", "text is not valid UTF-8 (byte 0:"),
            (b"   \n\t", "text is empty"),
            (b"", "text is empty"),
        ],
    )
    def test_bad_payloads(self, data: bytes, message: str) -> None:
        with pytest.raises(InvalidInput) as err:
            self.h.preprocess(pb.Input(data=data))
        assert message in str(err.value)

    def test_non_ascii_utf8_is_fine(self) -> None:
        assert self.h.preprocess(pb.Input(data="naïve café ☕".encode())).shape[0] >= 3

    def test_collate_pads_and_masks(self) -> None:
        a = self.h.preprocess(pb.Input(data=b"one"))
        b = self.h.preprocess(pb.Input(data=b"one two three four"))
        batch = self.h.collate([a, b])
        assert batch["ids"].shape == batch["mask"].shape == (2, b.shape[0])
        assert batch["mask"][0].sum() == a.shape[0] and batch["mask"][1].all()
        fixed = TextHandler({**SMALL_TEXT, "pad": "fixed"})
        assert fixed.fixed_shapes and fixed.collate([a])["ids"].shape == (1, 16)

    def test_forward_padding_does_not_change_result(self) -> None:
        model = self.h.build_model()
        a = self.h.preprocess(pb.Input(data=b"one"))
        b = self.h.preprocess(pb.Input(data=b"one two three four five six"))
        with torch.inference_mode():
            alone = self.h.forward(model, self.h.collate([a]))
            padded = self.h.forward(model, self.h.collate([a, b]))
        assert padded.shape == (2, 2)
        assert torch.allclose(alone[0], padded[0], atol=1e-5)


# -- tabular -------------------------------------------------------------------------------------------------
class TestTabular:
    h = TabularHandler({"features": "4", "hidden": "8", "layers": "1", "classes": "3"})

    def test_good_vector(self) -> None:
        t = self.h.preprocess(pb.Input(features=[0.5, -1.0, 2.0, 0.0]))
        assert t.dtype == torch.float32 and t.tolist() == [0.5, -1.0, 2.0, 0.0]
        with torch.inference_mode():
            out = self.h.forward(self.h.build_model(), self.h.collate([t, t]))
        assert out.shape == (2, 3) and torch.equal(out[0], out[1])

    @pytest.mark.parametrize(
        ("features", "message"),
        [
            ([1.0, 2.0, 3.0], "expected 4 features, got 3"),
            ([], "expected 4 features, got 0"),
            ([1.0] * 5, "expected 4 features, got 5"),
            ([0.0, 1.0, float("nan"), 2.0], "feature 2 is nan: features must be finite"),
            ([float("inf"), 1.0, 1.0, 1.0], "feature 0 is inf: features must be finite"),
            ([1.0, 1.0, 1.0, float("-inf")], "feature 3 is -inf"),
        ],
    )
    def test_bad_vectors(self, features: list[float], message: str) -> None:
        with pytest.raises(InvalidInput) as err:
            self.h.preprocess(pb.Input(features=features))
        assert message in str(err.value)


# -- null and the base class ----------------------------------------------------------------------
def test_null_handler_echoes_sizes_without_torch_device() -> None:
    h = NullHandler()
    assert not h.uses_device and h.build_model() is None
    items = [h.preprocess(pb.Input(data=b"abc")), h.preprocess(pb.Input(features=[1.0, 2.0]))]
    out = [h.postprocess(r) for r in h.forward(None, h.collate(items))]
    assert [o.label for o in out] == [3, 2]


def test_base_handler_methods_must_be_overridden() -> None:
    h = Handler()
    with pytest.raises(NotImplementedError):
        h.build_model()
    with pytest.raises(NotImplementedError):
        h.preprocess(pb.Input(data=b"x"))
    assert torch.equal(h.collate([torch.ones(2), torch.zeros(2)]), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
