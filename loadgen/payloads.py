"""Request payloads per model family, deterministic per seed, serialized once.

The load generator sends pre-serialized ``InferRequest`` bytes: a small pool of
distinct payloads per size bucket (real JPEGs for ``image``, text for ``text``,
feature vectors for ``tabular``), chosen by request index. Building them before the
run keeps encoding cost off the send path.
"""

from __future__ import annotations

import math
import random

from netgain.protos import inference_pb2 as pb
from netgain.server.handlers import create_handler


def size_bucket(size: int) -> int:
    """Round a size to two significant digits, so a recorded size distribution maps to few payloads."""
    if size <= 0:
        return 0
    digits = max(0, int(math.log10(size)) - 1)
    return int(round(size, -digits))


class PayloadFactory:
    def __init__(
        self, model: str, handler_options: dict[str, str] | None = None, seed: int = 0, variants: int = 8
    ) -> None:
        try:
            self.handler = create_handler(model, handler_options or {}, seed)
        except ValueError as exc:
            raise ValueError(f"cannot make payloads for model {model!r}: {exc}") from None
        self.model = model
        self.seed = seed
        self.variants = max(1, variants)
        self._inputs: dict[tuple[int, int], pb.Input] = {}
        self._requests: dict[tuple[int, int, int], bytes] = {}

    def _input(self, bucket: int, variant: int) -> pb.Input:
        key = (bucket, variant)
        item = self._inputs.get(key)
        if item is None:
            rng = random.Random(f"{self.seed}:{bucket}:{variant}")
            item = self.handler.example_input(rng, bucket or None)
            self._inputs[key] = item
        return item

    def request_bytes(self, index: int, size: int, items: int) -> bytes:
        """Serialized request for schedule row ``index``: the same bytes for the same index, size,
        items and seed."""
        bucket = size_bucket(size)
        variant = index % self.variants
        key = (bucket, variant, items)
        data = self._requests.get(key)
        if data is None:
            inputs = [self._input(bucket, (variant + j) % self.variants) for j in range(items)]
            data = pb.InferRequest(inputs=inputs).SerializeToString()
            self._requests[key] = data
        return data
