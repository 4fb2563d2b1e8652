"""A complete netgain handler: copy this file, change the model, and serve it.

    netgain serve --model handler_example:ReviewScorer --port 50051 --metrics-port 9464
    netgain load --target 127.0.0.1:50051 --rate 20 --duration 20 --out runs/mine
    netgain report runs/mine

Run both commands from the directory that holds this file (the current directory is searched
for the module). The load generator imports the same class for its payloads (``example_input``),
so it needs this file too. docs/server.md, "Handlers: your own model", describes each method.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from netgain.protos import inference_pb2 as pb  # Input (data: bytes, features: floats), Output
from netgain.server.handlers import Handler, InvalidInput


class ReviewScorer(Handler):
    """Scores a short UTF-8 review: hashed byte-bigram counts → a two-layer MLP → a label (0
    negative, 1 positive), its softmax score, and both class scores as ``values``.
    Options (``--handler-option key=value``): ``buckets`` (256), ``max_bytes`` (4096)."""

    name = "review-scorer"  # what the server reports as its model

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)  # keeps self.options (strings) and self.seed
        self.buckets = self.int_option("buckets", 256, hi=1 << 16)  # ValueError → one-line CLI error
        self.max_bytes = self.int_option("max_bytes", 4096, hi=1 << 24)

    def build_model(self) -> Any:
        """Once, on the CPU, before the server says SERVING; the server moves it to the device.
        Deterministic from the seed: no downloads (load real weights here with torch.load)."""
        import torch
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(nn.Linear(self.buckets, 64), nn.ReLU(), nn.Linear(64, 2)).eval()

    def preprocess(self, item: pb.Input) -> Any:
        """One request item → one tensor, on a CPU thread. InvalidInput fails only this request,
        with INVALID_ARGUMENT and this message."""
        import torch

        if not item.data:
            raise InvalidInput("empty review: send the text as UTF-8 in Input.data")
        if len(item.data) > self.max_bytes:
            raise InvalidInput(f"review of {len(item.data)} bytes is over max_bytes {self.max_bytes}")
        try:
            text = item.data.decode("utf-8").lower()
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"review is not UTF-8 ({exc.reason} at byte {exc.start})") from None
        counts = torch.zeros(self.buckets)
        raw = text.encode()
        for a, b in itertools.pairwise(raw):
            counts[(a * 31 + b) % self.buckets] += 1.0
        return counts / max(1, len(raw))

    def collate(self, items: list[Any]) -> Any:
        """The items of one batch → the model's input (the default, torch.stack, shown here)."""
        import torch

        return torch.stack(items)

    def forward(self, model: Any, batch: Any) -> Any:
        """On the device: the batch is already there; return one row per item."""
        return model(batch)

    def postprocess(self, row: Any) -> pb.Output:
        """One output row, back on the host → the item's Output (label, score, values)."""
        scores = row.float().softmax(-1)
        label = int(scores.argmax())
        return pb.Output(label=label, score=float(scores[label]), values=[float(v) for v in row])

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        """A valid payload: the server's warm-up and `netgain load` send these. ``size`` is the
        payload size asked for by `netgain load --size-bytes` (None: the model's default)."""
        words = ("great", "awful", "fast", "slow", "love", "broken", "works", "again", "never", "fine")
        n = max(1, min(size or 120, self.max_bytes))
        text = ""
        while len(text) < n:
            text += rng.choice(words) + " "
        return pb.Input(data=text[:n].encode())
