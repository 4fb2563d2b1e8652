"""The Open Inference Protocol (KServe v2 gRPC, ``inference.GRPCInferenceService``) beside netgain.v1.

``ModelInfer`` turns the request's input tensor into the handler's ``pb.Input`` items and enqueues
them through ``InferenceServicer.infer_items``, the path ``Infer`` takes: the same request id
(``x-request-id``, else the request's ``id``), admission, queue, batching, span log, metrics and
trailers (``server-timing``, ``x-request-id``), in the one-process server and in each ``--workers``
frontend alike. Tensors, one item per row:

- BYTES models (image: encoded JPEG/PNG; text: UTF-8; null: anything): input ``INPUT``, BYTES,
  shape ``[n]`` (or ``[n, 1]``): each element is one item's ``data``.
- feature models (tabular): input ``INPUT``, FP32, shape ``[n, features]``: each row one item.
- outputs ``LABEL`` (INT64 ``[n]``) and ``SCORE`` (FP32 ``[n]``), in ``raw_output_contents``, plus
  ``VALUES`` (FP32 ``[n, k]``) for a handler whose outputs carry values.

Either ``contents`` or ``raw_input_contents`` carries the input (tritonclient sends the latter), never
both. The element counts (the shape's and the data's) are checked against ``--max-items-per-request``
before any element becomes a Python object.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from netgain.protos import inference_pb2 as pb
from netgain.protos import oip_pb2 as oip
from netgain.server.service import InferenceServicer

INPUT_NAME = "INPUT"
VERSION = "1"
_LEN = struct.Struct("<I")


class BadTensor(ValueError):
    """The request's tensors do not fit the model: INVALID_ARGUMENT with this message."""


@dataclass(frozen=True)
class ModelIO:
    """The served model's tensors, as ModelMetadata declares them."""

    datatype: str  # "BYTES" or "FP32"
    features: int = 0  # FP32: the row width

    @property
    def input_shape(self) -> list[int]:
        return [-1, self.features] if self.datatype == "FP32" else [-1]

    def describe(self) -> str:
        return f"{INPUT_NAME!r} ({self.datatype} {self.input_shape})"


def model_io(handler: Any) -> ModelIO:
    """From the handler's own example payload: feature vectors are FP32 rows, anything else BYTES."""
    example = handler.example_input(random.Random(0))
    if len(example.features) and not example.data:
        return ModelIO("FP32", len(example.features))
    return ModelIO("BYTES")


def split_bytes(raw: bytes, limit: int | None = None) -> list[bytes]:
    """A raw BYTES tensor: each element a 4-byte little-endian length, then that many bytes;
    BadTensor as soon as it holds more than ``limit`` elements."""
    out: list[bytes] = []
    view = memoryview(raw)
    at = 0
    while at < len(view):
        if limit is not None and len(out) >= limit:
            raise BadTensor(f"raw BYTES tensor holds more than the {limit} elements of its shape")
        if at + 4 > len(view):
            raise BadTensor(f"raw BYTES tensor is malformed: {len(view) - at} bytes left where a length goes")
        (n,) = _LEN.unpack_from(view, at)
        at += 4
        if at + n > len(view):
            raise BadTensor(
                f"raw BYTES tensor is malformed: element {len(out)} declares {n} bytes, {len(view) - at} left"
            )
        out.append(bytes(view[at : at + n]))
        at += n
    return out


def _count(shape: Any) -> int:
    total = 1
    for d in shape:
        if d < 0:
            raise BadTensor(f"shape {list(shape)} has a negative dimension")
        total *= d
    return total


def to_inputs(request: Any, io: ModelIO, max_items: int | None = None) -> list[pb.Input]:
    """The request's one input tensor as handler items; BadTensor names what does not fit. Counts
    are checked (shape, then data) before any element is copied: a 12 MB message can declare
    millions of empty elements."""
    if len(request.inputs) != 1:
        raise BadTensor(
            f"request has {len(request.inputs)} input tensors; this model takes one: {io.describe()}"
        )
    tensor = request.inputs[0]
    if tensor.name != INPUT_NAME:
        raise BadTensor(f"input {tensor.name!r} is not this model's; it takes {io.describe()}")
    if tensor.datatype != io.datatype:
        raise BadTensor(
            f"input {INPUT_NAME!r} is {tensor.datatype or 'untyped'}; this model takes {io.describe()}"
        )
    raw = request.raw_input_contents
    if len(raw) > 1:
        raise BadTensor(f"{len(raw)} raw_input_contents for one input tensor")
    if raw and tensor.HasField("contents"):
        raise BadTensor(f"input {INPUT_NAME!r} has both contents and raw_input_contents: send one")
    count = _count(tensor.shape)
    if not tensor.shape:
        raise BadTensor(f"input {INPUT_NAME!r} has no shape; this model takes {io.describe()}")
    items = count if io.datatype == "BYTES" or not io.features else count // io.features
    if max_items is not None and items > max_items:
        raise BadTensor(
            f"request has {items} inputs, over the limit of {max_items} (--max-items-per-request)"
        )
    data = raw[0] if raw else b""  # each access to the repeated field copies the bytes
    if io.datatype == "BYTES":
        n = len(tensor.contents.bytes_contents)
        if not raw and n != count:
            raise BadTensor(f"input shape {list(tensor.shape)} holds {count} elements, the data {n}")
        elements = split_bytes(data, count) if raw else list(tensor.contents.bytes_contents)
        if len(elements) != count:
            raise BadTensor(
                f"input shape {list(tensor.shape)} holds {count} elements, the data {len(elements)}"
            )
        return [pb.Input(data=e) for e in elements]
    if tensor.shape[-1] != io.features:
        raise BadTensor(f"input shape {list(tensor.shape)}: rows of {io.features} features expected")
    if raw:
        if len(data) != 4 * count:
            raise BadTensor(
                f"input shape {list(tensor.shape)} is {4 * count} bytes of FP32, the data {len(data)}"
            )
        values = np.frombuffer(data, dtype="<f4")
    else:
        n = len(tensor.contents.fp32_contents)
        if n != count:
            raise BadTensor(f"input shape {list(tensor.shape)} holds {count} values, fp32_contents {n}")
        values = np.asarray(tensor.contents.fp32_contents, dtype=np.float32)
    rows = values.reshape(-1, io.features) if io.features else values.reshape(0, 0)
    return [pb.Input(features=row.tolist()) for row in rows]


def to_response(request: Any, model: str, outputs: list[pb.Output]) -> Any:
    """LABEL, SCORE (and VALUES) as raw little-endian tensors, in the order asked (all by default)."""
    n = len(outputs)
    tensors: dict[str, tuple[str, list[int], bytes]] = {
        "LABEL": ("INT64", [n], np.fromiter((o.label for o in outputs), dtype="<i8", count=n).tobytes()),
        "SCORE": ("FP32", [n], np.fromiter((o.score for o in outputs), dtype="<f4", count=n).tobytes()),
    }
    widths = {len(o.values) for o in outputs}
    if len(widths) == 1 and (k := widths.pop()) > 0:
        values = np.asarray([list(o.values) for o in outputs], dtype="<f4")
        tensors["VALUES"] = ("FP32", [n, k], values.tobytes())
    names = [o.name for o in request.outputs if o.name in tensors] or list(tensors)
    response = oip.ModelInferResponse(model_name=model, model_version=VERSION, id=request.id)
    for name in names:
        datatype, shape, raw = tensors[name]
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    return response


class OipServicer:
    """``inference.GRPCInferenceService`` over an InferenceServicer (its queue, readiness, trailers)."""

    def __init__(self, inner: InferenceServicer, io: ModelIO, platform: str = "netgain") -> None:
        self.inner = inner
        self.io = io
        self.platform = platform

    def _known(self, name: str, version: str) -> bool:
        return name == self.inner.model and version in ("", VERSION)

    def _missing(self, name: str, version: str) -> str:
        if name != self.inner.model:
            return f"model {name!r} is not served here (this server runs {self.inner.model!r})"
        return f"model {name!r} has only version {VERSION!r}, not {version!r}"

    def _ready(self) -> bool:
        return self.inner.ready and not self.inner.stopping

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return oip.ServerReadyResponse(ready=self._ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return oip.ModelReadyResponse(ready=self._known(request.name, request.version) and self._ready())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        if not self._known(request.name, request.version):
            await context.abort(grpc.StatusCode.NOT_FOUND, self._missing(request.name, request.version))
        meta = oip.ModelMetadataResponse(name=self.inner.model, versions=[VERSION], platform=self.platform)
        meta.inputs.add(name=INPUT_NAME, datatype=self.io.datatype, shape=self.io.input_shape)
        meta.outputs.add(name="LABEL", datatype="INT64", shape=[-1])
        meta.outputs.add(name="SCORE", datatype="FP32", shape=[-1])
        return meta

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        arrival = self.inner.clock()
        refused: tuple[Any, str] | None = None
        inputs: list[pb.Input] = []
        if request.model_name and not self._known(request.model_name, request.model_version):
            refused = (grpc.StatusCode.NOT_FOUND, self._missing(request.model_name, request.model_version))
        else:
            unknown = [o.name for o in request.outputs if o.name not in ("LABEL", "SCORE", "VALUES")]
            try:
                if unknown:
                    raise BadTensor(
                        f"output {unknown[0]!r} is not this model's; it answers 'LABEL' and 'SCORE'"
                    )
                inputs = to_inputs(request, self.io, self.inner.limits.max_items)
            except BadTensor as exc:
                refused = (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        p = await self.inner.infer_items(arrival, "", inputs, context, refused, fallback_id=request.id)
        return to_response(request, self.inner.model, p.outputs)
