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
from netgain.protos.service import OIP_SERVICE_NAME, SERVICE_NAME

NETGAIN_METHOD = f"/{SERVICE_NAME}/Infer"
OIP_METHOD = f"/{OIP_SERVICE_NAME}/ModelInfer"


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


OIP_KEYS = ("oip.model", "oip.input", "oip.datatype", "oip.shape")


def oip_request(options: dict[str, str], inputs: list[pb.Input]) -> bytes:
    """An Open Inference Protocol ModelInferRequest for ``inputs``: one tensor, one item per row
    (BYTES: each item's data, the raw length-prefixed encoding tritonclient sends; FP32: feature
    rows), shaped as the model's metadata declares with the batch dimension filled in."""
    import struct

    from netgain.protos import oip_pb2 as oip

    n = len(inputs)
    declared = [int(d) for d in options["oip.shape"].split(",") if d]
    req = oip.ModelInferRequest(model_name=options["oip.model"])
    tensor = req.inputs.add(name=options["oip.input"], datatype=options["oip.datatype"])
    if options["oip.datatype"] == "FP32":
        width = len(inputs[0].features) if inputs else 0
        tensor.shape.extend([n, width])
        req.raw_input_contents.append(b"".join(struct.pack(f"<{width}f", *i.features) for i in inputs))
    else:  # BYTES: [n], or [n, 1, ...] when the model declares more dimensions
        tensor.shape.extend([n] + [1] * max(0, len(declared) - 1))
        req.raw_input_contents.append(b"".join(struct.pack("<I", len(i.data)) + i.data for i in inputs))
    return req.SerializeToString()


class PayloadFactory:
    """Serialized requests: netgain.v1 ``InferRequest``s, or Open Inference Protocol
    ``ModelInferRequest``s when ``handler_options`` carry the ``oip.*`` keys of probe_oip_target."""

    def __init__(
        self, model: str, handler_options: dict[str, str] | None = None, seed: int = 0, variants: int = 8
    ) -> None:
        options = dict(handler_options or {})
        self.oip = {k: options.pop(k) for k in OIP_KEYS if k in options}
        # The method every request calls; the engine sends the bytes to it.
        self.method = OIP_METHOD if self.oip else NETGAIN_METHOD
        handler_options = options
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

    def key(self, index: int, size: int, items: int) -> tuple[int, int, int]:
        """What decides schedule row ``index``'s request: (size bucket, variant, items)."""
        return size_bucket(size), index % self.variants, items

    def inputs(self, key: tuple[int, int, int]) -> list[pb.Input]:
        """The items of the request ``key`` names: ``items`` consecutive variants of its bucket."""
        bucket, variant, items = key
        return [self._input(bucket, (variant + j) % self.variants) for j in range(items)]

    def request_bytes(self, index: int, size: int, items: int) -> bytes:
        """Serialized request for schedule row ``index``: the same bytes for the same index, size,
        items and seed."""
        key = self.key(index, size, items)
        data = self._requests.get(key)
        if data is None:
            inputs = self.inputs(key)
            if self.oip:
                data = oip_request(self.oip, inputs)
            else:
                data = pb.InferRequest(inputs=inputs).SerializeToString()
            self._requests[key] = data
        return data
