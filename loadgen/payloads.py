"""Request payloads per model family, deterministic per seed, serialized once.

The load generator sends pre-serialized ``InferRequest`` bytes: a small pool of
distinct payloads per size bucket (real JPEGs for ``image``, text for ``text``,
feature vectors for ``tabular``), chosen by request index. Building them before the
run keeps encoding cost off the send path.

The built-in models' payloads come from ``netgain.contract.payloads`` (no torch, no
tokenizers); only a user's ``module:Class`` handler is imported, for its ``example_input``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from netgain.contract import payloads as builtin
from netgain.protos import inference_pb2 as pb


def size_bucket(size: int) -> int:
    """Round a size to two significant digits, so a recorded size distribution maps to few payloads."""
    if size <= 0:
        return 0
    digits = max(0, int(math.log10(size)) - 1)
    return int(round(size, -digits))


def example_maker(
    model: str, handler_options: dict[str, str] | None = None, seed: int = 0
) -> Callable[[random.Random, int | None], pb.Input]:
    """``(rng, size) -> Input`` for ``model``: a built-in model's payloads, or the ``example_input``
    of a user's ``module:Class`` handler (imported here, and only then). ValueError naming the
    model when it has none."""
    options = handler_options or {}
    try:
        if model in builtin.BUILTIN:
            fields = builtin.builtin_payloads(model, options)
            return lambda rng, size: pb.Input(**fields(rng, size))
        if ":" not in model:
            names = ", ".join(sorted(builtin.BUILTIN))
            raise ValueError(f"unknown model {model!r}: use one of {names} or module:Class")
        from netgain.server.handlers import create_handler

        return create_handler(model, options, seed).example_input
    except ValueError as exc:
        raise ValueError(f"cannot make payloads for model {model!r}: {exc}") from None


class PayloadFactory:
    def __init__(
        self, model: str, handler_options: dict[str, str] | None = None, seed: int = 0, variants: int = 8
    ) -> None:
        self.example = example_maker(model, handler_options, seed)
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
            item = self.example(rng, bucket or None)
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
