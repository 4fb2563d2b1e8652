"""Text model: UTF-8 → a WordPiece tokenizer (HF tokenizers) → transformer encoder.

The vocabulary is built in code (special tokens, characters with their ``##``
continuations, and common English words), so any text tokenizes with no download.
"""

from __future__ import annotations

import random
import string
from typing import Any

from netgain.contract.payloads import WORDS, text_bytes
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers.base import Handler, InvalidInput, argmax_output

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
#: Characters kept per token of ``max_len`` before tokenising. English WordPiece averages ~4-5
#: characters a token, so the first ``16 * max_len`` characters hold more tokens than the model
#: takes; the rest would be tokenised only to be truncated (a 10 MiB payload cost 12-22 s of CPU).
CHARS_PER_TOKEN = 16
#: Default cap on a text payload (``max_bytes``): 64 characters a token of the default max_len.
DEFAULT_MAX_BYTES = 1 << 20


def build_tokenizer(max_len: int) -> Any:  # a tokenizers.Tokenizer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab: dict[str, int] = {}
    for special in SPECIALS:
        vocab[special] = len(vocab)
    chars = string.ascii_lowercase + string.digits + string.punctuation
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault("##" + ch, len(vocab))
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok: Any = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=64))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tok.enable_truncation(max_length=max_len)
    return tok


class TextHandler(Handler):
    """Options: ``max_len`` (tokens, default 128), ``layers`` (6), ``d_model`` (384), ``heads`` (6),
    ``classes`` (2), ``pad`` (``longest`` in the batch, or ``fixed`` to max_len for fixed shapes),
    ``activation`` (``relu`` or ``gelu``), ``vocab`` (embedding rows, at least the tokenizer's
    vocabulary; default: its size), ``max_bytes`` (largest payload accepted, default 1 MiB). The
    feed-forward width is 4 x d_model. A subclass changes the defaults (``DEFAULTS``): bert-base.

    Only the first ``CHARS_PER_TOKEN * max_len`` characters are tokenised (the model sees the first
    ``max_len`` tokens of them), so a payload's CPU cost is bounded whatever its size."""

    name = "text"
    DEFAULTS: dict[str, int | str] = {
        "max_len": 128,
        "layers": 6,
        "d_model": 384,
        "heads": 6,
        "vocab": 0,
        "pad": "longest",
        "activation": "relu",
    }

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        d = self.DEFAULTS
        self.max_len = self.int_option("max_len", int(d["max_len"]), lo=4, hi=8192)
        self.layers = self.int_option("layers", int(d["layers"]), hi=96)
        self.d_model = self.int_option("d_model", int(d["d_model"]), lo=8, hi=16384)
        self.heads = self.int_option("heads", int(d["heads"]), hi=256)
        self.classes = self.int_option("classes", 2, hi=1 << 16)
        pad = self.options.get("pad", str(d["pad"]))
        if pad not in ("longest", "fixed"):
            raise ValueError(f"handler option pad={pad!r}: use longest or fixed")
        self.activation = self.options.get("activation", str(d["activation"]))
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"handler option activation={self.activation!r}: use relu or gelu")
        if self.d_model % self.heads:
            raise ValueError(f"handler option d_model={self.d_model} is not divisible by heads={self.heads}")
        self.pad_fixed = pad == "fixed"
        self.fixed_shapes = self.pad_fixed
        self.max_bytes = self.int_option("max_bytes", DEFAULT_MAX_BYTES, lo=1)
        self.max_chars = CHARS_PER_TOKEN * self.max_len
        self.tokenizer = build_tokenizer(self.max_len)
        self.vocab_size = self.tokenizer.get_vocab_size()
        # Rows past the tokenizer's vocabulary are never looked up: they size the embedding as a
        # real model's vocabulary would (memory, not compute).
        rows = self.int_option("vocab", int(d["vocab"]), lo=0, hi=1 << 22)
        self.embedding_rows = max(self.vocab_size, rows)

    def build_model(self) -> Any:
        import torch
        from torch import nn

        d, max_len, activation = self.d_model, self.max_len, self.activation

        class Encoder(nn.Module):
            def __init__(self, vocab: int, layers: int, heads: int, classes: int) -> None:
                super().__init__()
                self.embed = nn.Embedding(vocab, d, padding_idx=0)
                self.pos = nn.Parameter(torch.randn(1, max_len, d) * 0.02)
                layer = nn.TransformerEncoderLayer(
                    d, heads, 4 * d, dropout=0.0, activation=activation, batch_first=True
                )
                self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                self.head = nn.Linear(d, classes)

            def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                x = self.embed(ids) + self.pos[:, : ids.shape[1]]
                x = self.encoder(x, src_key_padding_mask=~mask)
                keep = mask.unsqueeze(-1).to(x.dtype)
                pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1.0)
                return self.head(pooled)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return Encoder(self.embedding_rows, self.layers, self.heads, self.classes).eval()

    def preprocess(self, item: pb.Input) -> Any:
        import torch

        if len(item.data) > self.max_bytes:
            raise InvalidInput(
                f"text is {len(item.data)} bytes, over the limit of {self.max_bytes} bytes "
                f"(handler option max_bytes; the model reads at most {self.max_len} tokens)"
            )
        try:
            text = item.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"text is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
        # Cut before tokenising: what lies past max_chars would be truncated away anyway.
        ids = self.tokenizer.encode(text[: self.max_chars]).ids
        if len(ids) <= 2:  # only [CLS] [SEP]: nothing left after normalisation
            raise InvalidInput(
                "text is empty after normalisation (only whitespace, control characters, NUL or "
                "zero-width characters): send UTF-8 text in Input.data"
            )
        return torch.tensor(ids, dtype=torch.long)

    def collate(self, items: list[Any]) -> Any:
        import torch

        lengths = torch.tensor([int(t.shape[0]) for t in items])
        width = self.max_len if self.pad_fixed else int(lengths.max())
        # One padding call, not two slice assignments per row: the device process's collate holds
        # the GIL that the thread launching the forward needs.
        ids = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
        if ids.shape[1] < width:
            ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]))
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        return {"ids": ids, "mask": mask}

    def forward(self, model: Any, batch: Any) -> Any:
        return model(batch["ids"], batch["mask"])

    def postprocess(self, row: Any) -> pb.Output:
        return argmax_output(row)

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        """Text of about ``size`` bytes (default 400, about 80 tokens)."""
        return pb.Input(data=text_bytes(rng, size))


class BertBaseHandler(TextHandler):
    """A BERT-base-sized encoder with random weights: 12 layers, hidden 768, 12 heads, feed-forward
    3072, GELU, a 30,522-row embedding, every request padded to 128 tokens (fixed shapes, as BERT
    is usually served). The same tokenizer and options as ``text``; only the defaults differ."""

    name = "bert-base"
    DEFAULTS: dict[str, int | str] = {
        **TextHandler.DEFAULTS,
        "layers": 12,
        "d_model": 768,
        "heads": 12,
        "vocab": 30522,
        "pad": "fixed",
        "activation": "gelu",
    }
